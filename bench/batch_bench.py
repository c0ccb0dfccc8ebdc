"""Batch API benchmark: does a big batch fill idle capacity without delaying interactive chats?

One Switchyard server (SmolLM2 with the shipped scheduler limits) and three phases on it:

1. chats alone: streamed chat completions at concurrency `--chat-concurrency` (default 4): their TTFT p50;
2. the batch's requests sent over HTTP at concurrency 32 with nothing else running: the capacity they could use;
3. the batch (`--lines` /v1/completions requests, default 2,000, through /v1/files and /v1/batches) while the same
   chats run at the same concurrency until it completes: the chats' TTFT p50 and the batch's throughput.

Targets (issue 37): the chats' TTFT p50 in phase 3 within 1.2x of phase 1, and the batch's output tokens per second
in phase 3 at least 0.7x of phase 2's. The batch requests are random token-id prompts of `--input-len` tokens that
produce exactly `--output-len` tokens (`ignore_eos`), as bench/loadgen.py's; the chats are short questions.

    python bench/batch_bench.py [--lines 2000] [--output-len 64] [--chat-concurrency 4]
        [--batch-concurrency 16] [--smoke]

`--smoke` runs a few dozen requests per phase to check that the pieces work; its numbers mean nothing. Only the
ratios of a full run on an otherwise idle machine do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import serve, stop  # noqa: E402
from bench.loadgen import random_prompts, run_load, sse_chunks  # noqa: E402
from bench.serve_bench import SHIPPED_CONFIG  # noqa: E402

MODEL = "smollm2-135m-instruct"
QUESTIONS = [
    "What is the capital of France?",
    "Explain what a CPU cache is.",
    "Write a haiku about rain.",
    "Name three prime numbers.",
    "How do planes fly?",
    "What is a linked list?",
]


def start(workdir: Path, batch_concurrency: int) -> tuple[subprocess.Popen, str]:
    repo = workdir / "repo" / MODEL
    repo.mkdir(parents=True)
    repo.joinpath("config.yaml").write_text(SHIPPED_CONFIG.read_text())
    server = serve(
        repo.parent, "--files-dir", str(workdir / "files"), "--batch-max-concurrency", str(batch_concurrency)
    )
    return server.proc, server.url


async def chat_ttft(session: aiohttp.ClientSession, question: str, output_len: int) -> float:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": output_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    begin = time.perf_counter()
    ttft = 0.0
    async with session.post("/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for chunk in sse_chunks(resp):
            if not ttft and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - begin
    return ttft


async def chats(
    base_url: str, concurrency: int, count: int, output_len: int, until: asyncio.Event | None = None
) -> list[float]:
    """TTFTs of `count` chats at `concurrency` (or, with `until`, as many as run until it is set, at least one
    round)."""
    ttfts: list[float] = []
    async with aiohttp.ClientSession(base_url=base_url, timeout=aiohttp.ClientTimeout(total=3600)) as session:
        issued = 0

        async def worker() -> None:
            nonlocal issued
            while issued < count and not (until is not None and until.is_set() and issued >= concurrency):
                question = QUESTIONS[issued % len(QUESTIONS)]
                issued += 1
                ttfts.append(await chat_ttft(session, question, output_len))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ttfts


def batch_file(prompts: list[list[int]], output_len: int) -> bytes:
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": p, "max_tokens": output_len, "temperature": 0, "ignore_eos": True},
        }
        for i, p in enumerate(prompts)
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


async def run_batch_with_chats(base_url: str, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, float]:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=600)
    source = await client.files.create(file=("bench.jsonl", batch_file(prompts, args.output_len)), purpose="batch")
    done = asyncio.Event()
    begin = time.perf_counter()
    batch = await client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")
    chat_task = asyncio.create_task(chats(base_url, args.chat_concurrency, 10**9, args.output_len, until=done))
    while (batch := await client.batches.retrieve(batch.id)).status not in (
        "completed",
        "failed",
        "cancelled",
        "expired",
    ):
        await asyncio.sleep(0.25)
    elapsed = time.perf_counter() - begin
    done.set()
    ttfts = await chat_task
    assert batch.status == "completed", batch
    assert batch.request_counts is not None and batch.request_counts.completed == len(prompts), batch.request_counts
    output_tokens = batch.usage.output_tokens if batch.usage else len(prompts) * args.output_len
    return {
        "batch_tok_s": output_tokens / elapsed,
        "batch_seconds": elapsed,
        "chat_ttft_p50_ms": statistics.median(ttfts) * 1000,
        "chats": len(ttfts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--chat-concurrency", type=int, default=4)
    parser.add_argument("--chats", type=int, default=64, help="chats in phase 1")
    parser.add_argument("--batch-concurrency", type=int, default=16, help="--batch-max-concurrency of the server")
    parser.add_argument("--smoke", action="store_true", help="a few requests per phase: checks the pieces work")
    args = parser.parse_args()
    if args.smoke:
        args.lines, args.chats, args.output_len, args.input_len = 24, 8, 8, 32
    prompts = random_prompts(args.lines, args.input_len, vocab=49152)
    # the batch's own prompts, of the same shape: phase 2's would be found in the prefix cache
    batch_prompts = random_prompts(args.lines, args.input_len, vocab=49152, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start(Path(tmp), args.batch_concurrency)
        try:
            print("phase 1: chats alone", flush=True)
            alone = asyncio.run(chats(url, args.chat_concurrency, args.chats, args.output_len))
            print("phase 2: the batch's requests over HTTP at c=32, nothing else", flush=True)
            capacity = asyncio.run(run_load(url, MODEL, prompts, args.output_len, 32))
            print("phase 3: the batch while chats run", flush=True)
            mixed = asyncio.run(run_batch_with_chats(url, batch_prompts, args))
        finally:
            stop(proc)
    ttft_alone = statistics.median(alone) * 1000
    http_tok_s = capacity.output_tokens / capacity.duration
    print(
        json.dumps(
            {
                "lines": args.lines,
                "output_len": args.output_len,
                "chat_concurrency": args.chat_concurrency,
                "batch_concurrency": args.batch_concurrency,
                "chat_ttft_p50_ms_alone": round(ttft_alone, 1),
                "chat_ttft_p50_ms_with_batch": round(mixed["chat_ttft_p50_ms"], 1),
                "ttft_ratio": round(mixed["chat_ttft_p50_ms"] / ttft_alone, 3),  # target <= 1.2
                "http_c32_tok_s": round(http_tok_s, 1),
                "batch_tok_s_with_chats": round(mixed["batch_tok_s"], 1),
                "throughput_ratio": round(mixed["batch_tok_s"] / http_tok_s, 3),  # target >= 0.7
                "chats_during_batch": mixed["chats"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
