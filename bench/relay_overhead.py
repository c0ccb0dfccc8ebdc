"""The remote engine's own cost, without a model: Switchyard `backend: remote` in front of a stand-in upstream that
streams canned tokens at a fixed pace, against the same stand-in directly.

With a real engine behind it (bench/gateway_tax.py) the gateway's few milliseconds drown in the engine's noise;
here the upstream costs next to nothing, so what is left is the gateway: time to first token added at c=1
(upstream answering at once) and the gateway's CPU per relayed token at c=8 (upstream at 50 tokens/s per stream).

    python bench/relay_overhead.py [--requests 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import free_port, stop, wait_ready  # noqa: E402
from bench.gateway_tax import cpu_seconds, remote_config, start_switchyard  # noqa: E402
from bench.loadgen import random_prompts, run_load  # noqa: E402
from bench.serve_bench import MODEL  # noqa: E402


def serve_upstream(port: int, delay: float) -> None:
    """The stand-in: vLLM's /v1/completions stream shape (one token per chunk, a usage chunk, [DONE])."""
    from aiohttp import web

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 2048}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n, head = body["max_tokens"], {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": MODEL}
        for i in range(n):
            if delay:
                await asyncio.sleep(delay)
            choice = {"index": 0, "text": " tok", "logprobs": None, "finish_reason": "length" if i == n - 1 else None}
            await resp.write(f"data: {json.dumps({**head, 'choices': [choice]})}\n\n".encode())
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n, "total_tokens": n + len(body["prompt"])}
        await resp.write(f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        return resp

    app = web.Application()
    app.add_routes(
        [web.get("/health", health), web.get("/v1/models", models), web.post("/v1/completions", completions)]
    )
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def start_upstream(delay: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(port), "--delay", str(delay)])
    wait_ready(f"http://127.0.0.1:{port}/health", proc)
    return proc, f"http://127.0.0.1:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--delay", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream, args.delay)
        return
    prompt = random_prompts(1, 128, 49152, seed=1)[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for delay in (0.0, 0.02):
            upstream, up_url = start_upstream(delay)
            gateway, gw_url = start_switchyard(sys.executable, remote_config(up_url), Path(tmp), f"gw{delay}", 300)
            try:
                if delay == 0.0:
                    direct, through = (
                        asyncio.run(run_load(url, MODEL, [prompt] * args.requests, 4, 1)).summary()["ttft_p50_ms"]
                        for url in (up_url, gw_url)
                    )
                    rows.append(
                        f"| TTFT p50, c=1, upstream answers at once | {direct:.1f} ms | {through:.1f} ms "
                        f"| {through - direct:+.1f} ms |"
                    )
                else:
                    prompts = random_prompts(32, 128, 49152, seed=2)
                    before = cpu_seconds(gateway.pid)
                    run = asyncio.run(run_load(gw_url, MODEL, prompts, 128, 8))
                    cpu_ms = (cpu_seconds(gateway.pid) - before) * 1000 / run.output_tokens
                    direct_run = asyncio.run(run_load(up_url, MODEL, prompts, 128, 8)).summary()
                    ours = run.summary()
                    rate, peer = ours["output_tok_s"], direct_run["output_tok_s"]
                    rows.append(
                        f"| output tok/s, c=8, upstream at 50 tok/s per stream | {peer:.0f} | {rate:.0f} "
                        f"| {rate / peer:.3f}x |"
                    )
                    rows.append(f"| gateway CPU per relayed token, c=8 | | {cpu_ms:.3f} ms | |")
            finally:
                stop(gateway)
                stop(upstream)
    print("| relay overhead | direct | through the gateway | difference |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
