"""The passthrough backend's own latency, without a model: Switchyard `backend: openai` in front of a stand-in
upstream that answers at once, against the same stand-in called directly.

With llama-server behind it (passthrough_bench.py) the gateway's milliseconds at c=1 are measured against an
engine's; here the upstream costs next to nothing, so what is left is what the gateway adds to each request: its
time to first token and to the end of the answer, and its CPU. Requests go one at a time, in pairs (one direct, one
through the gateway, the order alternating), and the figures are medians of the pairs' differences, so drift of the
machine falls on both arms alike. The clients open a connection per request, as passthrough_bench.py's do; the
gateway keeps its connections to the upstream alive, as it does in front of llama-server.

Two stand-ins (`--upstream`, both by default):
* `aiohttp`: relay_overhead.py's (an aiohttp server: Nagle's algorithm off, each write sent at once);
* `httplib`: writes as llama.cpp's `llama-server` does through cpp-httplib: Nagle's algorithm on, the status line
  and headers in one send once the first token is ready, then each chunk of the chunked body in a send of its own,
  connections kept alive. A send waits until the one before it is acknowledged, so the gateway's delayed ACKs
  show here.

    python bench/passthrough_overhead.py [--pairs 400] [--output-len 16] [--upstream aiohttp,httplib]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import free_port, stop, wait_ready  # noqa: E402
from bench.gateway_tax import cpu_seconds, start_switchyard  # noqa: E402
from bench.loadgen import sse_chunks  # noqa: E402
from bench.relay_overhead import start_upstream  # noqa: E402
from bench.serve_bench import MODEL  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog. " * 8


def passthrough_config(upstream: str) -> str:
    return f"backend: openai\nmax_model_len: 2048\nopenai:\n  base_url: {upstream}/v1\n  model: {MODEL}\n"


# ------------------------------------------------------------------------------------- the cpp-httplib stand-in
def _httplib_connection(conn: socket.socket) -> None:
    """One kept-alive connection, answered as cpp-httplib does (no TCP_NODELAY: every send below is its own)."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
    reader = conn.makefile("rb")
    with conn, reader:
        while request_line := reader.readline():
            headers = {}
            while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            raw = reader.read(int(headers.get("content-length", "0")))
            if request_line.startswith(b"GET"):
                listing = {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 2048}]}
                payload = json.dumps(listing).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(payload)
                )
                conn.sendall(payload)
                continue
            body = json.loads(raw)
            n, head = body["max_tokens"], {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": MODEL}
            events = []
            for i in range(n):
                choice = {
                    "index": 0,
                    "text": " tok",
                    "logprobs": None,
                    "finish_reason": "length" if i == n - 1 else None,
                }
                events.append({**head, "choices": [choice]})
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n, "total_tokens": n + 1}
                events.append({**head, "choices": [], "usage": usage})
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for data in [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]:
                conn.sendall(b"%x\r\n%s\r\n" % (len(data), data))
            conn.sendall(b"0\r\n")
            conn.sendall(b"\r\n")


def serve_httplib_like(port: int) -> None:
    with socket.create_server(("127.0.0.1", port)) as server:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=_httplib_connection, args=(conn,), daemon=True).start()


def start_httplib_like() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-httplib", str(port)])
    wait_ready(f"http://127.0.0.1:{port}/v1/models", proc)
    return proc, f"http://127.0.0.1:{port}"


# ------------------------------------------------------------------------------------------------ measurement
async def one(session: aiohttp.ClientSession, url: str, output_len: int) -> tuple[float, float]:
    """Seconds to the first text chunk and to the end of the stream."""
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": output_len,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = 0.0
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for chunk in sse_chunks(resp):
            if not first and chunk.get("choices") and chunk["choices"][0].get("text"):
                first = time.perf_counter() - start
    return first, time.perf_counter() - start


async def measure(direct: str, gateway: str, gateway_pid: int, pairs: int, output_len: int) -> dict[str, float]:
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        for _ in range(20):  # warm-ups: the pools, the first requests' one-time costs
            await one(session, direct, output_len)
            await one(session, gateway, output_len)
        ttft: dict[str, list[float]] = {"direct": [], "gateway": []}
        total: dict[str, list[float]] = {"direct": [], "gateway": []}
        cpu = cpu_seconds(gateway_pid)
        for i in range(pairs):
            arms = [("direct", direct), ("gateway", gateway)]
            for arm, url in arms if i % 2 == 0 else arms[::-1]:
                first, end = await one(session, url, output_len)
                ttft[arm].append(first)
                total[arm].append(end)
        cpu = cpu_seconds(gateway_pid) - cpu

    def ms(xs: list[float]) -> float:
        return statistics.median(xs) * 1000

    return {
        "ttft_direct_ms": ms(ttft["direct"]),
        "ttft_gateway_ms": ms(ttft["gateway"]),
        "ttft_added_ms": ms([g - d for g, d in zip(ttft["gateway"], ttft["direct"], strict=True)]),
        "total_direct_ms": ms(total["direct"]),
        "total_gateway_ms": ms(total["gateway"]),
        "total_added_ms": ms([g - d for g, d in zip(total["gateway"], total["direct"], strict=True)]),
        "gateway_cpu_ms_per_request": cpu * 1000 / pairs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=400, help="request pairs, sequential (default: %(default)s)")
    parser.add_argument("--output-len", type=int, default=16, help="tokens per answer (default: %(default)s)")
    parser.add_argument("--upstream", default="aiohttp,httplib", help="stand-ins to run (default: %(default)s)")
    parser.add_argument("--serve-httplib", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_httplib:
        serve_httplib_like(args.serve_httplib)
        return
    starters = {"aiohttp": lambda: start_upstream(0.0), "httplib": start_httplib_like}
    kinds = args.upstream.split(",")
    if not set(kinds) <= set(starters):
        parser.error(f"--upstream takes {', '.join(starters)}")
    results = {}
    for kind in kinds:
        upstream, up_url = starters[kind]()
        try:
            with tempfile.TemporaryDirectory() as tmp:
                gateway, gw_url = start_switchyard(sys.executable, passthrough_config(up_url), Path(tmp), "gw", 300)
                try:
                    results[kind] = asyncio.run(measure(up_url, gw_url, gateway.pid, args.pairs, args.output_len))
                finally:
                    stop(gateway)
        finally:
            stop(upstream)
    print(f"{args.pairs} pairs at c=1, {args.output_len} tokens each; medians")
    print("| stand-in | TTFT direct | TTFT added | whole answer direct | added | gateway CPU per request |")
    print("|---|---|---|---|---|---|")
    for kind, r in results.items():
        print(
            f"| {kind} | {r['ttft_direct_ms']:.2f} ms | {r['ttft_added_ms']:+.2f} ms | {r['total_direct_ms']:.2f} ms "
            f"| {r['total_added_ms']:+.2f} ms | {r['gateway_cpu_ms_per_request']:.2f} ms |"
        )


if __name__ == "__main__":
    main()
