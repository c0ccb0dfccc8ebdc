"""A forest model (XGBoost, FIL backend) over KServe v2 at concurrency 32: dynamic batching on against off, and
against XGBoost's own batch predict in this process (the ceiling).

Each request scores one row (a ranking service scoring candidates one by one). The same model file serves both
servers: with `dynamic_batching` (max_batch_size 1024, up to 1 ms of queue delay) requests share predictor calls;
without it every request is its own call. The ceiling predicts the same rows in batches of 32 with no server.
Only the ratios mean anything on a noisy machine.

    python bench/forest_bench.py [--requests 4000] [--concurrency 32] [--trees 200]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gateway_server import serve, stop  # noqa: E402

FEATURES = 32


def train(folder: Path, trees: int) -> tuple[object, np.ndarray]:
    """An XGBoost binary classifier on synthetic data, saved as xgboost.json; returns it and the rows to score."""
    import xgboost

    rng = np.random.default_rng(0)
    x = rng.normal(size=(20000, FEATURES)).astype(np.float32)
    y = (x[:, :4].sum(axis=1) + x[:, 4] * x[:, 5] + rng.normal(scale=0.5, size=len(x)) > 0).astype(np.int64)
    model = xgboost.XGBClassifier(n_estimators=trees, max_depth=6, random_state=0, n_jobs=1).fit(x, y)
    model.get_booster().save_model(str(folder / "xgboost.json"))
    return model, rng.normal(size=(4096, FEATURES)).astype(np.float32)


def start(repo: Path, model_file: Path, batched: bool, threads: int) -> tuple[subprocess.Popen, str]:
    folder = repo / ("batched" if batched else "unbatched") / "forest"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "xgboost.json").write_bytes(model_file.read_bytes())
    (folder / "config.pbtxt").write_text(
        'backend: "fil"\nmax_batch_size: 1024\n'
        f'input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]\n'
        'output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'parameters [ { key: "model_type" value: { string_value: "xgboost_json" } },\n'
        '  { key: "output_class" value: { string_value: "true" } },\n'
        '  { key: "predict_proba" value: { string_value: "true" } },\n'
        f'  {{ key: "cpu_nthread" value: {{ string_value: "{threads}" }} }} ]\n'
        + ("dynamic_batching { max_queue_delay_microseconds: 1000 }\n" if batched else "")
    )
    server = serve(folder.parent, health="/v2/health/ready")
    return server.proc, server.url


async def load(url: str, rows: np.ndarray, requests: int, concurrency: int) -> tuple[float, list[float]]:
    """Rows/s and per-request latencies (aiohttp keeps the client's own CPU cost low on 2 cores)."""
    import aiohttp

    bodies = [
        {"inputs": [{"name": "input__0", "datatype": "FP32", "shape": [1, FEATURES], "data": r.tolist()}]} for r in rows
    ]
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as client:

        async def worker(indices: range, record: bool) -> None:
            for i in indices:
                t0 = time.perf_counter()
                async with client.post("/v2/models/forest/infer", json=bodies[i % len(bodies)]) as r:
                    r.raise_for_status()
                    await r.read()
                if record:
                    latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker(range(w, 4 * concurrency, concurrency), False) for w in range(concurrency)))
        start_t = time.perf_counter()
        await asyncio.gather(*(worker(range(w, requests, concurrency), True) for w in range(concurrency)))
        return requests / (time.perf_counter() - start_t), latencies


def ceiling(model: object, rows: np.ndarray, requests: int, batch: int) -> float:
    booster = model.get_booster()  # type: ignore[attr-defined]
    booster.inplace_predict(rows[:batch])  # warm-up
    start_t = time.perf_counter()
    for i in range(0, requests, batch):
        j = i % len(rows)
        booster.inplace_predict(rows[j : j + batch])
    return requests / (time.perf_counter() - start_t)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument(
        "--cpu-nthread",
        type=int,
        default=-1,
        help="the model's cpu_nthread (most XGBoost threads per call; -1 = every CPU)",
    )
    args = parser.parse_args()
    results: dict[str, float] = {}
    latency: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model, rows = train(Path(tmp), args.trees)
        for batched in (True, False):
            proc, url = start(Path(tmp), Path(tmp) / "xgboost.json", batched, args.cpu_nthread)
            name = "dynamic batching on" if batched else "dynamic batching off"
            try:
                results[name], latency[name] = asyncio.run(load(url, rows, args.requests, args.concurrency))
            finally:
                stop(proc)
        results[f"XGBoost alone, batch {args.concurrency}"] = ceiling(model, rows, args.requests, args.concurrency)
    print(f"| forest ({args.trees} trees), c={args.concurrency}, 1 row/request | rows/s | p50 ms | p99 ms |")
    print("|---|---|---|---|")
    for name, value in results.items():
        lat = latency.get(name)
        p50, p99 = (f"{_pct(lat, 0.5):.1f}", f"{_pct(lat, 0.99):.1f}") if lat else ("", "")
        print(f"| {name} | {value:.0f} | {p50} | {p99} |")
    on, off = results["dynamic batching on"], results["dynamic batching off"]
    print(f"| **on / off** | {on / off:.2f}x |")
    print(f"| **on / XGBoost alone** | {on / results[f'XGBoost alone, batch {args.concurrency}']:.2f}x |")


if __name__ == "__main__":
    main()
