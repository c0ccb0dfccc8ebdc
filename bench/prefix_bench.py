"""Prefix caching: 32 concurrent requests sharing a 512-token system prompt, each with its own 32-token question.

Prints the prompt tokens the engine computed against the prompt tokens sent (what it computes without prefix
caching), from each response's `usage.prompt_tokens_details.cached_tokens` and, as a cross-check, the server's
`switchyard_prefix_cache_hits` counter; then the same requests against a server with `enable_prefix_caching: false`.
Target: computed <= 1/8 of the tokens sent. Native engine, float32, SmolLM2-135M-Instruct.

    python bench/prefix_bench.py [--requests 32] [--prefix 512] [--suffix 32]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prefix", type=int, default=512, help="shared system-prompt tokens")
    parser.add_argument("--suffix", type=int, default=32, help="tokens of each request's own question")
    args = parser.parse_args()
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
