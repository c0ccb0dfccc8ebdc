"""Goodput under overload: open-loop arrivals at the rate the server sustains at c=8, then at three times that rate.

First the sustainable rate is measured: 8 clients in a closed loop for `--calibrate-seconds`, each sending a streamed
64-token completion (`ignore_eos`) of a random `--input-len`-token prompt as soon as its last one finished; the rate
is the requests they completed per second. Then requests arrive open-loop (Poisson, whatever the server answers) at
that rate for `--seconds`, then at `--overload` times it. Each request carries the client's queue timeout
(`timeout`, `--queue-timeout` seconds; 0 sends none and the model's default applies): a request that cannot start
in time is refused with 429 and Retry-After instead of waiting past its client's deadline.

Goodput is counted as the issue that motivated overload control defines it: output tokens of the requests whose
first token came within `--slo` seconds (3), per second of the arrival window. Reported per phase: goodput, the
requests answered, refused with 429 (and how many of those carried Retry-After), and admitted requests that failed
(a 200 whose stream ended in an error or short of its tokens: must be 0). The target: goodput at 3x >= 0.9 of 1x.

    python bench/overload_bench.py                       # starts a server over the default repository
    python bench/overload_bench.py --url http://host:8000 --model smollm2-135m-instruct
    python bench/overload_bench.py --seconds 10 --calibrate-seconds 10   # a quick look

Speed figures mean something only on an otherwise idle machine (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import serve, stop  # noqa: E402
from bench.loadgen import random_prompts, sse_chunks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass
class Outcome:
    status: int
    ttft: float | None = None
    tokens: int = 0
    retry_after: bool = False
    failed: bool = False  # admitted (200) but the stream ended in an error or short


@dataclass
class Phase:
    name: str
    rate: float
    window: float
    outcomes: list[Outcome] = field(default_factory=list)

    def report(self, slo: float, output_len: int) -> dict[str, float]:
        ok = [o for o in self.outcomes if o.status == 200]
        refused = [o for o in self.outcomes if o.status == 429]
        good = sum(o.tokens for o in ok if o.ttft is not None and o.ttft <= slo and not o.failed)
        return {
            "rate_rps": round(self.rate, 3),
            "requests": len(self.outcomes),
            "answered": len(ok),
            "refused_429": len(refused),
            "429_with_retry_after": sum(o.retry_after for o in refused),
            "other_status": len(self.outcomes) - len(ok) - len(refused),
            "admitted_failed": sum(o.failed for o in ok),
            "ttft_p50_s": round(_pct([o.ttft for o in ok if o.ttft is not None], 50), 3),
            "ttft_p99_s": round(_pct([o.ttft for o in ok if o.ttft is not None], 99), 3),
            "goodput_tok_s": round(good / self.window, 1),
            "all_tokens_tok_s": round(sum(o.tokens for o in ok) / self.window, 1),
        }


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


async def one(
    session: aiohttp.ClientSession, model: str, prompt: list[int], output_len: int, queue_timeout: float
) -> Outcome:
    body: dict[str, object] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if queue_timeout > 0:
        body["timeout"] = queue_timeout
    start = time.perf_counter()
    async with session.post("/v1/completions", json=body) as resp:
        if resp.status != 200:
            await resp.read()
            return Outcome(resp.status, retry_after="Retry-After" in resp.headers)
        out = Outcome(200)
        try:
            async for chunk in sse_chunks(resp):
                if "error" in chunk:
                    out.failed = True
                if chunk.get("usage"):
                    out.tokens = chunk["usage"]["completion_tokens"]
                if out.ttft is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                    out.ttft = time.perf_counter() - start
        except (aiohttp.ClientError, json.JSONDecodeError):
            out.failed = True
        out.failed = out.failed or out.tokens != output_len
        return out


async def calibrate(
    session: aiohttp.ClientSession,
    model: str,
    prompts: list[list[int]],
    output_len: int,
    seconds: float,
    clients: int = 8,
) -> float:
    """Requests per second that `clients` closed-loop clients complete."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < deadline:
            out = await one(session, model, prompts[i % len(prompts)], output_len, 0)
            done += out.status == 200 and not out.failed
            i += clients

    start = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    return done / (time.perf_counter() - start)


async def open_loop(
    session: aiohttp.ClientSession,
    model: str,
    prompts: list[list[int]],
    output_len: int,
    phase: Phase,
    queue_timeout: float,
    seed: int,
) -> None:
    """Poisson arrivals at `phase.rate` for `phase.window` seconds; waits for every request to end."""
    rng = random.Random(seed)
    tasks = []
    start = time.perf_counter()
    at = 0.0
    i = 0
    while True:
        at += rng.expovariate(phase.rate)
        if at >= phase.window:
            break
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(session, model, prompts[i % len(prompts)], output_len, queue_timeout)))
        i += 1
    phase.outcomes = list(await asyncio.gather(*tasks))


async def run(args: argparse.Namespace, url: str) -> dict[str, object]:
    prompts = random_prompts(256, args.input_len, args.vocab, seed=1)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        base_url=url, connector=connector, timeout=aiohttp.ClientTimeout(total=3600)
    ) as session:
        await one(session, args.model, prompts[0], 8, 0)  # warm-up
        rate = args.rate or await calibrate(session, args.model, prompts, args.output_len, args.calibrate_seconds)
        phases = [Phase("1x", rate, args.seconds), Phase(f"{args.overload:g}x", rate * args.overload, args.seconds)]
        for k, phase in enumerate(phases):
            await open_loop(session, args.model, prompts, args.output_len, phase, args.queue_timeout, seed=k)
            await asyncio.sleep(args.pause)  # let the queue empty between phases
    reports = {p.name: p.report(args.slo, args.output_len) for p in phases}
    base = reports["1x"]["goodput_tok_s"]
    over = reports[phases[1].name]["goodput_tok_s"]
    return {
        "sustained_rate_rps_at_c8": round(rate, 3),
        "queue_timeout_s": args.queue_timeout,
        "slo_s": args.slo,
        "phases": reports,
        "goodput_ratio": round(over / base, 3) if base else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (default: start one over the default repository)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--seconds", type=float, default=60.0, help="arrival window of each phase")
    parser.add_argument("--calibrate-seconds", type=float, default=30.0)
    parser.add_argument("--rate", type=float, help="skip calibration: the 1x rate in requests per second")
    parser.add_argument("--overload", type=float, default=3.0, help="the second phase's rate, times the first's")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--slo", type=float, default=3.0, help="first token within this many seconds counts")
    parser.add_argument(
        "--queue-timeout",
        type=float,
        default=2.5,
        help="each request's `timeout` (seconds to start); 0: none sent (the model's default)",
    )
    parser.add_argument("--pause", type=float, default=5.0, help="seconds between phases")
    args = parser.parse_args()
    proc = None
    url = args.url
    if url is None:
        server = serve(ROOT / "model_repository")
        proc, url = server.proc, server.url
    try:
        print(json.dumps(asyncio.run(run(args, url)), indent=2))
    finally:
        if proc is not None:
            stop(proc)


if __name__ == "__main__":
    main()
