"""A small streaming load generator for OpenAI-compatible servers (the same workload for every peer).

Random token-id prompts of a fixed length go to /v1/completions with `ignore_eos`, so every request produces
exactly `output_len` tokens (counted from the usage chunk); per request we record time to first token and the gaps
between tokens. An aiohttp client, as vLLM's own benchmark uses: the client shares the 2 cores with the server,
and httpx's line reader took 2.8 times its CPU per token (0.23-0.25 against 0.08-0.09 ms at c=32).

vLLM's client itself is not used: it strips every network read, so an event split between reads loses its
separator and its usage chunk, and it then counts tokens by re-tokenizing the text: 3-9% fewer than were
generated, measured against our server at c=32.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp


@dataclass
class RequestResult:
    ttft: float
    itls: list[float] = field(default_factory=list)
    output_tokens: int = 0
    latency: float = 0.0


@dataclass
class RunResult:
    concurrency: int
    prompts: int
    duration: float
    results: list[RequestResult]

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.results)

    def summary(self) -> dict[str, float]:
        ttfts = sorted(r.ttft for r in self.results)
        tpots = sorted((r.latency - r.ttft) / max(1, r.output_tokens - 1) for r in self.results)
        itls = sorted(x for r in self.results for x in r.itls) or [0.0]

        def pct(xs: list[float], p: float) -> float:
            return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000

        return {
            "output_tok_s": self.output_tokens / self.duration,
            "ttft_p50_ms": pct(ttfts, 50),
            "ttft_p99_ms": pct(ttfts, 99),
            "tpot_p50_ms": pct(tpots, 50),
            "tpot_p99_ms": pct(tpots, 99),
            "itl_mean_ms": statistics.fmean(itls) * 1000,
        }


def random_prompts(count: int, input_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(input_len)] for _ in range(count)]


async def sse_chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """The JSON chunks of a streamed OpenAI response, as each whole event arrives (`[DONE]` ends the stream)."""
    pending = b""
    async for data in resp.content.iter_any():
        # whole events only: a read may end anywhere, even inside an event or between its two newlines
        *events, pending = (pending + data).replace(b"\r\n", b"\n").split(b"\n\n")
        for line in (line for event in events for line in event.split(b"\n")):
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                yield json.loads(line[6:])


async def _one(session: aiohttp.ClientSession, model: str, prompt: list[int], output_len: int) -> RequestResult:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    last = start
    result = RequestResult(ttft=0.0)
    async with session.post("/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for chunk in sse_chunks(resp):
            if chunk.get("usage"):
                result.output_tokens = chunk["usage"]["completion_tokens"]
            if not chunk.get("choices") or not chunk["choices"][0].get("text"):
                continue
            now = time.perf_counter()
            if result.ttft == 0.0:
                result.ttft = now - start
            else:
                result.itls.append(now - last)
            last = now
    result.latency = time.perf_counter() - start
    return result


async def run_load(base_url: str, model: str, prompts: list[list[int]], output_len: int, concurrency: int) -> RunResult:
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(base_url=base_url, connector=connector, timeout=timeout) as session:
        for p in prompts[:2]:  # warm-ups, not measured
            await _one(session, model, p, 8)
        sem = asyncio.Semaphore(concurrency)

        async def guarded(p: list[int]) -> RequestResult:
            async with sem:
                return await _one(session, model, p, output_len)

        start = time.perf_counter()
        results = await asyncio.gather(*(guarded(p) for p in prompts))
        return RunResult(concurrency, len(prompts), time.perf_counter() - start, list(results))
