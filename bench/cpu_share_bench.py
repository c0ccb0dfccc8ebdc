"""Threads per model: an embedding model's throughput beside a busy LLM against what its CPU share predicts.

Three servers, one after the other, on the same texts (docs/cpu.md#threads-per-model):
  1. alone: all-MiniLM-L6-v2 by itself with `cpu_threads: K` -- what its share predicts;
  2. shared: the same model with SmolLM2 (`pytorch.gemm_threads: B - K`, B the CPU budget) in one server, SmolLM2
     kept busy by streamed chats while the embeddings are measured -- the target is >= 0.9x of (1);
  3. unshared: both models on their defaults (each asks for the whole budget), SmolLM2 as busy -- the contention
     the shares remove.
Each line also shows the torch threads the embedding model's batches ran with (switchyard_model_torch_threads) and
the LLM's tokens/s meanwhile. Only the ratios mean anything; run it on a machine nothing else uses.

    python bench/cpu_share_bench.py [--embed-threads K] [--requests 512] [--concurrency 16] [--chats 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import gateway_server  # noqa: E402
from bench.embeddings_bench import load  # noqa: E402
from bench.gateway_server import stop  # noqa: E402
from engines.cpu_budget import cpu_budget  # noqa: E402

EMBED = "all-minilm-l6-v2"
LLM = "smollm2-135m-instruct"
EMBED_CONFIG = (ROOT / "model_repository" / EMBED / "config.yaml").read_text()
LLM_CONFIG = (ROOT / "model_repository" / LLM / "config.yaml").read_text()


def serve(repo: Path, embed_threads: int | None, llm_threads: int | None) -> tuple[subprocess.Popen, str]:
    """A server over `repo`: MiniLM (with `cpu_threads` when given) and, when `llm_threads` is not None, SmolLM2
    (0: its default share)."""
    (repo / EMBED).mkdir(parents=True)
    (repo / EMBED / "config.yaml").write_text(
        EMBED_CONFIG + (f"cpu_threads: {embed_threads}\n" if embed_threads else "")
    )
    if llm_threads is not None:
        (repo / LLM).mkdir()
        share = f"pytorch:\n  gemm_threads: {llm_threads}\n" if llm_threads else ""
        (repo / LLM / "config.yaml").write_text(LLM_CONFIG + share)
    server = gateway_server.serve(repo)
    return server.proc, server.url


async def busy_llm(url: str, chats: int, stop_event: asyncio.Event) -> tuple[int, float]:
    """Keep `chats` streamed chats running until `stop_event`; (completion tokens, seconds)."""
    import aiohttp

    tokens = 0
    body = {
        "model": LLM,
        "messages": [{"role": "user", "content": "Tell a long story about a freight yard."}],
        "max_tokens": 256,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=600)) as client:

        async def one() -> None:
            nonlocal tokens
            while not stop_event.is_set():
                async with client.post("/v1/chat/completions", json=body) as r:
                    r.raise_for_status()
                    async for line in r.content:
                        if line.startswith(b"data: {") and b'"usage"' in line:
                            usage = json.loads(line[6:]).get("usage") or {}
                            tokens += usage.get("completion_tokens", 0)

        await asyncio.gather(*(one() for _ in range(chats)))
    return tokens, time.perf_counter() - started


async def beside(url: str, requests: int, concurrency: int, chats: int) -> tuple[float, float]:
    """Embeddings texts/s while the LLM is busy, and the LLM's tokens/s meanwhile."""
    stop_event = asyncio.Event()
    llm = asyncio.create_task(busy_llm(url, chats, stop_event))
    await asyncio.sleep(3)  # the chats are decoding
    rate, _ = await load(url, requests, concurrency)
    stop_event.set()
    tokens, seconds = await llm
    return rate, tokens / seconds


def torch_threads(url: str) -> str:
    import httpx

    found = re.search(
        rf'^switchyard_model_torch_threads{{model="{EMBED}"}} (\S+)$', httpx.get(f"{url}/metrics").text, re.M
    )
    return found.group(1) if found else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    budget = cpu_budget().threads
    parser.add_argument("--embed-threads", type=int, default=max(1, budget // 4), help="K (default: budget / 4)")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--chats", type=int, default=8, help="streamed chats keeping the LLM busy")
    args = parser.parse_args()
    k = args.embed_threads
    if k >= budget:
        parser.error(f"--embed-threads must leave the LLM a thread of the budget of {budget}")
    rows: list[tuple[str, float, str, float | None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, embed, llm in (
            (f"alone, cpu_threads {k}", k, None),
            (f"beside SmolLM2 (gemm_threads {budget - k}), shares", k, budget - k),
            ("beside SmolLM2, defaults (no shares)", None, 0),
        ):
            proc, url = serve(Path(tmp) / str(len(rows)), embed, llm)
            try:
                if llm is None:
                    rate, tok_s = asyncio.run(load(url, args.requests, args.concurrency))[0], None
                else:
                    rate, tok_s = asyncio.run(beside(url, args.requests, args.concurrency, args.chats))
                rows.append((name, rate, torch_threads(url), tok_s))
            finally:
                stop(proc)
    print(
        f"CPU budget {budget} threads; /v1/embeddings at c={args.concurrency}, {args.chats} chats keeping the LLM busy"
    )
    print("| MiniLM | texts/s | torch threads | SmolLM2 tok/s |\n|---|---|---|---|")
    for name, rate, threads, tok_s in rows:
        print(f"| {name} | {rate:.0f} | {threads} | {'' if tok_s is None else f'{tok_s:.0f}'} |")
    ratio = rows[1][1] / rows[0][1]
    print(f"| **shared / alone** | {ratio:.2f}x (target >= 0.90) | | |")
    print(f"| **defaults / alone** | {rows[2][1] / rows[0][1]:.2f}x | | |")


if __name__ == "__main__":
    main()
