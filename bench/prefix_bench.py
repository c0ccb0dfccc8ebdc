"""Prefix caching: 32 concurrent requests sharing a 512-token system prompt, each with its own 32-token question.

Prints the prompt tokens the engine computed against the prompt tokens sent (what it computes without prefix
caching), from each response's `usage.prompt_tokens_details.cached_tokens` and, as a cross-check, the server's
`switchyard_prefix_cache_hits` counter; then the same requests against a server with `enable_prefix_caching: false`.
Target: computed <= 1/8 of the tokens sent. Native engine, float32, SmolLM2-135M-Instruct.

    python bench/prefix_bench.py [--requests 32] [--prefix 512] [--suffix 32]

`--chat`: the chat-app workload instead. 32 streamed chats at once (c=32), all with one fixed system prompt (about
600 tokens) and each its own question, against one server with prefix caching on: time to first token p50 / p90 /
p99, and the TTFT of one such chat alone (its system prompt not cached) for scale. Each round uses a system prompt
of its own, so no round finds the previous one's in the cache. Requests that share a prefix with a running prefill
should be admitted together once it is committed: p90 / alone near 1, not the 3x of one admission per step.

    python bench/prefix_bench.py --chat [--requests 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import random_prompts  # noqa: E402
from bench.serve_bench import MODEL, start_switchyard, stop  # noqa: E402


async def send_all(url: str, prompts: list[list[int]]) -> tuple[int, int, float]:
    """All prompts at once; (prompt tokens, cached prompt tokens, seconds until the last answer)."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def one(prompt: list[int]) -> tuple[int, int]:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}
            resp = await client.post("/v1/completions", json=body)
            resp.raise_for_status()
            usage = resp.json()["usage"]
            return usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0

        started = time.perf_counter()
        counts = await asyncio.gather(*(one(p) for p in prompts))
        return sum(c[0] for c in counts), sum(c[1] for c in counts), time.perf_counter() - started


def hits_counter(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    match = re.search(r'^switchyard_prefix_cache_hits_total\{model="[^"]+"\} ([0-9.e+]+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


def system_prompt(variant: int) -> str:
    """About 600 tokens of a chat app's fixed instructions; `variant` makes a prompt no earlier round cached."""
    rules = " ".join(
        f"Rule {i}: when a customer asks about order type {i * 7 + variant}, answer politely, name the "
        f"policy section {i}.{variant} and never promise a refund above {i * 10} dollars."
        for i in range(16)
    )
    return f"You are the support assistant of shop number {variant}. {rules} Keep answers short."


async def chat_ttft(url: str, system: str, question: str, client: httpx.AsyncClient) -> float:
    """Seconds from sending one streamed chat until its first chunk (the server sends none before the first token)."""
    body = {"model": MODEL, "stream": True, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    started = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        first = None
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data:"):
                first = time.perf_counter() - started
        assert first is not None, "the stream sent no chunk"
        return first


async def chat_round(url: str, variant: int, requests: int) -> tuple[float, list[float]]:
    """(TTFT of one chat alone with a cold system prompt, TTFTs of `requests` chats sent at once with another)."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=requests + 4)) as client:
        alone = await chat_ttft(url, system_prompt(10_000 + variant), "What is your name?", client)
        system = system_prompt(variant)
        questions = [f"Question {i}: where is my order number {1000 + i}?" for i in range(requests)]
        ttfts = await asyncio.gather(*(chat_ttft(url, system, q, client) for q in questions))
        return alone, sorted(ttfts)


def chat_main(requests: int, rounds: int) -> None:
    def pct(xs: list[float], p: float) -> float:
        return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_switchyard("float32", Path(tmp), {"enable_prefix_caching": True})
        try:
            asyncio.run(chat_round(url, 999, 4))  # warm-up: kernels, allocator
            rows = [asyncio.run(chat_round(url, r, requests)) for r in range(rounds)]
        finally:
            stop(proc)
    print(f"| {requests} chats at once, one ~600-token system prompt | TTFT p50 | p90 | p99 | one chat alone "
          "| p90 / alone |")
    print("|---|---|---|---|---|---|")
    for r, (alone, ttfts) in enumerate(rows):
        print(f"| round {r + 1} | {pct(ttfts, 50):.0f} ms | {pct(ttfts, 90):.0f} ms | {pct(ttfts, 99):.0f} ms "
              f"| {alone * 1000:.0f} ms | {pct(ttfts, 90) / (alone * 1000):.2f}x |")
    p50s = sorted(pct(t, 50) for _, t in rows)
    p99s = sorted(pct(t, 99) for _, t in rows)
    print(f"| **median of {rounds} rounds** | **{p50s[len(p50s) // 2]:.0f} ms** | | **{p99s[len(p99s) // 2]:.0f} ms** "
          "| | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prefix", type=int, default=512, help="shared system-prompt tokens")
    parser.add_argument("--suffix", type=int, default=32, help="tokens of each request's own question")
    parser.add_argument("--chat", action="store_true", help="the fixed-system-prompt chat workload (TTFT at c=32)")
    parser.add_argument("--rounds", type=int, default=3, help="--chat: rounds, each with its own system prompt")
    args = parser.parse_args()
    if args.chat:
        chat_main(args.requests, args.rounds)
        return
    shared = random_prompts(1, args.prefix, 49152, seed=7)[0]
    prompts = [shared + own for own in random_prompts(args.requests, args.suffix, 49152, seed=8)]
    rows = []
    for caching in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            proc, url = start_switchyard("float32", Path(tmp), {"enable_prefix_caching": caching})
            try:
                sent, cached, seconds = asyncio.run(send_all(url, prompts))
                rows.append((caching, sent, cached, hits_counter(url), seconds))
            finally:
                stop(proc)
    print(f"| {args.requests} requests, {args.prefix}-token shared prefix + {args.suffix} own | prompt tokens sent "
          "| cached (usage) | cached (metric) | computed | computed / sent | all answered in |")
    print("|---|---|---|---|---|---|---|")
    for caching, sent, cached, metric, seconds in rows:
        print(f"| prefix caching {'on' if caching else 'off'} | {sent} | {cached} | {metric:.0f} | {sent - cached} "
              f"| {(sent - cached) / sent:.3f} | {seconds:.1f} s |")
    on, off = rows
    print(f"| **computed, on / off** | | | | | **{(on[1] - on[2]) / (off[1] - off[2]):.3f}** (target <= 0.125) "
          f"| {off[4] / on[4]:.1f}x faster |")


if __name__ == "__main__":
    main()
