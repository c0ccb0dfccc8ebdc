"""Fallback under load: the first upstream of a route killed mid-run. Target (issue 37): 0 failed requests that
were not already streaming.

Two upstreams serve the same model (two Switchyard servers on SmolLM2's shipped GGUF, or two llama.cpp
`llama-server`s when `--llama-server` or $SWITCHYARD_LLAMA_SERVER names one); a Switchyard gateway serves each as
an `openai` passthrough model (`a`, `b`) and a route `fallback: [a, b]` over them. `--concurrency` closed-loop
clients (a share of them streaming) send chat completions to the route for `--seconds`; at `--kill-at` upstream a
gets SIGKILL (no goodbye: its connections drop mid-answer). Every request is counted by outcome:

* `ok`: a complete answer (a stream: `[DONE]` and no error event);
* `failed-not-streaming`: an error status, a broken connection or a bad answer before the client got a byte of
  the answer: the route should have fallen back. Target 0; the exit status is 1 otherwise;
* `failed-while-streaming`: a stream that broke after its first event (text already sent cannot be taken back).

and by the model that served it (the route's `x-switchyard-model` header), before and after the kill.

    python bench/fallback_bench.py [--seconds 60] [--kill-at 20] [--concurrency 8] [--stream-share 0.5]
        [--max-tokens 32] [--max-requests 20000] [--threads 1] [--llama-server PATH] [--json FILE]

Bounded: the run stops at `--seconds` or `--max-requests`, whichever comes first, and each request at 120 s. Only
127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gateway_server import Started, serve, stop  # noqa: E402
from bench.llamacpp_bench import (  # noqa: E402
    MODEL,
    PARAGRAPHS,
    shipped_gguf,
    start_llama_server,
    start_switchyard,
)
from bench.llamacpp_env import find_llama_server  # noqa: E402

ROUTE = "fallback"
OK, FAILED_EARLY, FAILED_STREAMING = "ok", "failed-not-streaming", "failed-while-streaming"
REQUEST_TIMEOUT_S = 120


@dataclass
class Result:
    started: float  # seconds since the run began
    stream: bool
    outcome: str
    served: str | None  # x-switchyard-model
    fallbacks: str | None  # x-switchyard-fallbacks
    error: str = ""


def start_upstream(name: str, work: Path, llama_server: Path | None, threads: int, slots: int) -> Started:
    folder = work / name
    folder.mkdir()
    if llama_server is not None:
        return start_llama_server(llama_server, shipped_gguf(), threads, slots, folder / "server.log")
    return start_switchyard(shipped_gguf(), threads, folder, folder / "server.log", max_num_seqs=slots)


def start_gateway(a: Started, b: Started, work: Path, slots: int) -> Started:
    """Switchyard with the passthrough models `a` and `b` and the route `fallback: [a, b]`."""
    repo = work / "gateway" / "repo"
    for name, upstream in (("a", a), ("b", b)):
        (repo / name).mkdir(parents=True)
        (repo / name / "config.yaml").write_text(
            f"backend: openai\nmax_model_len: 2048\nscheduler: {{max_num_seqs: {slots}}}\n"
            f"openai:\n  base_url: {upstream.url}/v1\n  model: {MODEL}\n  connect_timeout_seconds: 2\n"
        )
    routes = work / "gateway" / "routes.yaml"
    routes.write_text(f"routes:\n  {ROUTE}: [a, b]\n")
    return serve(repo, "--routes", str(routes), log=work / "gateway" / "server.log", timeout=1800)


def kill_tree(proc: psutil.Process) -> None:
    """SIGKILL to the process and its children: nothing of the upstream closes its connections cleanly."""
    for p in [*proc.children(recursive=True), proc]:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)


async def one_request(session: aiohttp.ClientSession, body: dict, t0: float) -> Result:
    stream, started = bool(body.get("stream")), time.monotonic() - t0
    got_event = False
    served = fallbacks = None
    try:
        async with session.post("/v1/chat/completions", json=body) as resp:
            served = resp.headers.get("x-switchyard-model")
            fallbacks = resp.headers.get("x-switchyard-fallbacks")
            if resp.status != 200:
                text = await resp.text()
                return Result(started, stream, FAILED_EARLY, served, fallbacks, f"HTTP {resp.status}: {text[:200]}")
            if not stream:
                answer = await resp.json()
                ok = isinstance(answer, dict) and bool(answer.get("choices"))
                return Result(started, stream, OK if ok else FAILED_EARLY, served, fallbacks, "" if ok else str(answer))
            done = False
            async for raw in resp.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                got_event = True
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                elif '"error"' in data and '"choices"' not in data:
                    return Result(started, stream, FAILED_STREAMING, served, fallbacks, data[:200])
            if done:
                return Result(started, stream, OK, served, fallbacks)
            outcome = FAILED_STREAMING if got_event else FAILED_EARLY
            return Result(started, stream, outcome, served, fallbacks, "the stream ended without [DONE]")
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        outcome = FAILED_STREAMING if got_event else FAILED_EARLY
        return Result(started, stream, outcome, served, fallbacks, f"{exc.__class__.__name__}: {exc}"[:200])


async def drive(args: argparse.Namespace, gateway: str, upstream_a: Started) -> tuple[list[Result], float]:
    """The closed-loop clients; upstream a killed at `kill_at`. Returns the results and the kill's time."""
    results: list[Result] = []
    t0 = time.monotonic()
    end = t0 + args.seconds
    streaming = round(args.concurrency * args.stream_share)
    victim = psutil.Process(upstream_a.proc.pid)
    # A connection per request: the clients' own keep-alive cannot make a failure that is not the gateway's.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)

    async def client(index: int) -> None:
        n = 0
        while time.monotonic() < end and len(results) < args.max_requests:
            prompt = f"{index}.{n}. {PARAGRAPHS[(index + n) % len(PARAGRAPHS)][:300]}\nSummarize this in one line."
            body = {
                "model": ROUTE,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stream": index < streaming,
            }
            results.append(await one_request(session, body, t0))
            n += 1

    async def killer() -> None:
        await asyncio.sleep(args.kill_at)
        kill_tree(victim)
        print(f"upstream a killed at {time.monotonic() - t0:.1f} s", flush=True)

    async with aiohttp.ClientSession(base_url=gateway, connector=connector, timeout=timeout) as session:
        kill = asyncio.create_task(killer())
        await asyncio.gather(*(client(i) for i in range(args.concurrency)))
        killed = not kill.cancel()
    if not killed:
        print("warning: the run ended before the kill; raise --seconds or lower --kill-at", flush=True)
    return results, args.kill_at


def route_metrics(gateway: str) -> list[str]:
    with contextlib.suppress(OSError, aiohttp.ClientError):

        async def get() -> str:
            async with aiohttp.ClientSession() as s, s.get(f"{gateway}/metrics") as resp:
                return await resp.text()

        text = asyncio.run(get())
        return [line for line in text.splitlines() if line.startswith("switchyard_route_")]
    return []


def report(results: list[Result], kill_at: float) -> dict:
    phases = {
        "before the kill": [r for r in results if r.started < kill_at],
        "after": [r for r in results if r.started >= kill_at],
    }
    summary: dict = {"requests": len(results)}
    print(
        f"\n{'phase':16} {'requests':>8} {OK:>6} {FAILED_EARLY:>21} {FAILED_STREAMING:>23} {'ok by a':>8} {'by b':>6}"
    )
    for phase, rows in phases.items():
        outcomes = Counter(r.outcome for r in rows)
        served = Counter(r.served for r in rows if r.outcome == OK)
        summary[phase] = {"outcomes": dict(outcomes), "served_ok": {str(k): v for k, v in served.items()}}
        print(
            f"{phase:16} {len(rows):8} {outcomes[OK]:6} {outcomes[FAILED_EARLY]:21} {outcomes[FAILED_STREAMING]:23} "
            f"{served['a']:8} {served['b']:6}"
        )
    fell_back = Counter(r.fallbacks for r in results if r.fallbacks)
    summary["fallback_headers"] = dict(fell_back)
    print(f"responses that fell back (x-switchyard-fallbacks): {dict(fell_back) or 'none'}")
    for outcome in (FAILED_EARLY, FAILED_STREAMING):
        errors = Counter(f"{'stream' if r.stream else 'plain'}: {r.error}" for r in results if r.outcome == outcome)
        if errors:
            print(f"{outcome}, most common:")
            for error, count in errors.most_common(5):
                print(f"  {count:5} x {error}")
    summary["failed_not_streaming"] = sum(r.outcome == FAILED_EARLY for r in results)
    summary["failed_while_streaming"] = sum(r.outcome == FAILED_STREAMING for r in results)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60, help="length of the run (default: %(default)s)")
    parser.add_argument("--kill-at", type=float, help="when upstream a is killed (default: a third of --seconds)")
    parser.add_argument("--concurrency", type=int, default=8, help="closed-loop clients (default: %(default)s)")
    parser.add_argument("--stream-share", type=float, default=0.5, help="share of streaming clients (default: 0.5)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of each request (default: 32)")
    parser.add_argument("--max-requests", type=int, default=20000, help="stop after this many (default: 20000)")
    parser.add_argument("--threads", type=int, default=1, help="each upstream's threads (default: %(default)s)")
    parser.add_argument(
        "--llama-server", type=Path, help="upstreams are llama-servers (default: $SWITCHYARD_LLAMA_SERVER, if set)"
    )
    parser.add_argument("--json", type=Path, help="also write the summary and every request here")
    args = parser.parse_args()
    if args.kill_at is None:
        args.kill_at = args.seconds / 3
    if not 0 <= args.stream_share <= 1 or args.concurrency < 1 or args.seconds <= 0:
        parser.error("--stream-share is within [0, 1], --concurrency and --seconds are positive")
    binary = args.llama_server or (find_llama_server() if os.environ.get("SWITCHYARD_LLAMA_SERVER") else None)
    kind = f"llama-server ({binary})" if binary else "Switchyard on SmolLM2"
    with tempfile.TemporaryDirectory(prefix="fallback-bench-") as tmp:
        work = Path(tmp)
        print(f"starting upstreams a and b: {kind} ...", flush=True)
        upstreams: list[Started] = []
        try:
            for name in ("a", "b"):
                upstreams.append(start_upstream(name, work, binary, args.threads, args.concurrency))
            gateway = start_gateway(upstreams[0], upstreams[1], work, args.concurrency)
            try:
                print(
                    f"c={args.concurrency} ({round(args.concurrency * args.stream_share)} streaming) for "
                    f"{args.seconds:g} s, upstream a killed at {args.kill_at:g} s",
                    flush=True,
                )
                results, kill_at = asyncio.run(drive(args, gateway.url, upstreams[0]))
                metrics = route_metrics(gateway.url)
            finally:
                stop(gateway.proc)
        finally:
            for upstream in upstreams:
                stop(upstream.proc)
    summary = report(results, kill_at)
    print("route metrics:\n  " + "\n  ".join(metrics))
    verdict = "met" if summary["failed_not_streaming"] == 0 else "MISSED"
    print(f"target: 0 failed requests that were not streaming: {summary['failed_not_streaming']} ({verdict})")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "requests": [asdict(r) for r in results]}, indent=1))
    sys.exit(0 if summary["failed_not_streaming"] == 0 else 1)


if __name__ == "__main__":
    main()
