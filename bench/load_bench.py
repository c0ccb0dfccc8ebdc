"""Time to ready and memory while loading: Switchyard's server on a GGUF file at its first start and at later ones,
beside llama.cpp's own `llama-server` on the same file.

Switchyard's first start reads the file and caches what it read (the blocks in transformers' row order, then the
kernel's packed panels: engines/pytorch/panel_cache.py); later starts read that cache. So each server is started
`--starts` times in a row on one repository and one fresh cache folder (the first start is a first start), and
stopped after each. Per start it prints: seconds from launch to a 200 from /health; the process tree's peak RSS
while loading (sampled every 0.1 s) and its RSS once ready (idle, no request served: the KV pool is faulted in
lazily, so this is the weights, the tokenizer and the interpreter), each against the file's size; and for
Switchyard the cache folder's size after the start. Both use `--threads` threads; llama-server with one slot of
2048 tokens and its host prompt cache off, as in llamacpp_bench.py. The file's pages are in the page cache for
every start but the first one of all (a first read from disk depends on the disk, not on the server).

    python bench/load_bench.py --model llama-8b --starts 3     # a real_size_models.py file
    python bench/load_bench.py --gguf FILE [--no-llama-server]

Nothing else should run beside it: the times are a machine's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gateway_server import Started, stop, tree_rss  # noqa: E402
from bench.llamacpp_bench import shipped_gguf, start_llama_server, start_switchyard  # noqa: E402
from bench.llamacpp_env import SERVER_MISSING, find_llama_server  # noqa: E402

MIB = 2**20


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _measure(started: Started, file_bytes: int) -> dict[str, float]:
    time.sleep(1.0)  # settled: the first step's scratch is not loading
    ready_rss = tree_rss(psutil.Process(started.proc.pid))
    stop(started.proc)
    return {
        "ready_s": started.ready_s,
        "peak": started.load_peak_rss / MIB,
        "peak_x": started.load_peak_rss / file_bytes,
        "ready": ready_rss / MIB,
        "ready_x": ready_rss / file_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, help="the GGUF file (default: the shipped SmolLM2 Q4_1)")
    parser.add_argument("--model", help="a real_size_models.py file: llama-1b, llama-3b, llama-8b, qwen3-moe, gpt-oss")
    parser.add_argument("--starts", type=int, default=3, help="starts of each server (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--int8-activations", action="store_true", help="Switchyard with pytorch.int8_activations")
    parser.add_argument("--no-llama-server", action="store_true", help="Switchyard only")
    args = parser.parse_args()
    if args.model:
        from bench.real_size_models import model_file

        gguf = model_file(args.model)
    else:
        gguf = args.gguf or shipped_gguf()
    file_bytes = gguf.stat().st_size
    binary = None if args.no_llama_server else find_llama_server()
    if binary is None and not args.no_llama_server:
        sys.exit(SERVER_MISSING)
    print(f"file: {gguf} ({file_bytes / MIB:.0f} MiB); {args.threads} threads")
    rows = []
    with tempfile.TemporaryDirectory(prefix="load-bench-") as tmp:
        work, cache = Path(tmp), Path(tmp) / "cache"
        for i in range(args.starts):
            print(f"starting Switchyard ({'first start' if i == 0 else 'later start'})", flush=True)
            started = start_switchyard(
                gguf,
                args.threads,
                work,
                work / f"switchyard-{i}.log",
                int8=args.int8_activations,
                flags=("--cache-dir", str(cache)),
            )
            rows.append(("Switchyard", i, {**_measure(started, file_bytes), "cache": _folder_bytes(cache) / MIB}))
        for i in range(args.starts if binary is not None else 0):
            print("starting llama-server", flush=True)
            started = start_llama_server(binary, gguf, args.threads, 1, work / f"llama-server-{i}.log")
            rows.append(("llama-server", i, _measure(started, file_bytes)))
    print(
        "\n| server | start | ready s | peak RSS while loading MiB (x file) | RSS once ready MiB (x file) | cache MiB |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for server, i, m in rows:
        cache_mib = f"{m['cache']:.0f}" if "cache" in m else "-"
        print(
            f"| {server} | {'first' if i == 0 else f'later ({i + 1})'} | {m['ready_s']:.1f} | {m['peak']:.0f} "
            f"({m['peak_x']:.2f}x) | {m['ready']:.0f} ({m['ready_x']:.2f}x) | {cache_mib} |"
        )


if __name__ == "__main__":
    main()
