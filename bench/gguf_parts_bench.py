"""A batch-1 step's projections of SmolLM2 GGUF files of different types, part by part, side by side in one process.

Why: a Q4_K_M file is a mix (Q5_0 for the 576-wide tensors, Q4_K/Q6_K for ffn_down, Q8_0 for the lm_head and some
attn_v), so its step's distance to a Q4_1 file's is a sum of per-type distances. This puts each part's time next to
the same part of the other files, with the bytes it reads and the floor those bytes take at this machine's read
bandwidth.

Every file is loaded as the engine serves it (`PyTorchEngine`, float32 arithmetic on the blocks, `--threads` kernel
threads). A part is one kind of projection over all layers (qkv, o, gate_up with SiLU, down) or the lm_head, called
with one row, as a decode step calls it; the parts are timed round-robin across the files (one pass of a part over
every layer of file A, then of file B, ...), so machine noise hits the files alike, and the medians are printed per
step (ms), with the types the part holds, the MB it reads (the packed blocks), the GB/s that makes, the floor at the
measured read bandwidth of all threads, and the ratio of time against the first file. Attention, norms, sampling and
Python are not in it (bench/step_profile.py has those; they do not depend on the weight types).

    python bench/gguf_parts_bench.py [--files shipped Q4_1 Q4_K_M] [--reps 40] [--threads 2]

`--files`: "shipped" (the default model's Q4_1 file: Q4_1 projections, Q8_0 lm_head), a type bench/gguf_files.py
makes (Q4_0 ... Q6_K, Q4_K_M, ...; the K mixes need llama.cpp, see there), or a GGUF file's path.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gguf_files import quantized, shipped_gguf  # noqa: E402
from bench.step_profile import read_bandwidth  # noqa: E402
from engines.pytorch.engine import PyTorchEngine  # noqa: E402
from engines.pytorch.gguf_blocks import TYPES  # noqa: E402

PARTS = ("qkv", "o", "gate_up_act", "down", "lm_head")
TYPE_NAMES = {t.code: name for name, t in TYPES.items()}


def _model(spec: str) -> Path:
    if spec == "shipped":
        return shipped_gguf()
    return Path(spec) if Path(spec).is_file() else quantized(spec)


def _types(module) -> collections.Counter[str]:
    """The bytes of each block type a projection holds (none: float32 weights)."""
    nbytes: collections.Counter[str] = collections.Counter()
    packed = getattr(getattr(module, "_linear", None) or module, "_blocks", None)
    if packed is None:
        return nbytes
    codes = packed.segs.tolist()[1::2]
    for code, tensor in zip(codes, packed.tensors, strict=True):
        nbytes[TYPE_NAMES.get(code, str(code))] += tensor.numel() * tensor.element_size()
    return nbytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", nargs="+", default=["shipped", "Q4_1", "Q4_K_M"])
    parser.add_argument("--reps", type=int, default=40, help="timed passes of each part per file")
    parser.add_argument("--threads", type=int, default=2, help="kernel threads (the engine's gemm_threads)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bandwidth = read_bandwidth(args.threads)
    engines = {}
    for spec in args.files:
        t0 = time.perf_counter()
        engines[spec] = PyTorchEngine(
            _model(spec), dtype="float32", kv_cache_tokens=64, block_size=16, gemm_threads=args.threads
        )
        print(f"{spec}: loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    torch.set_num_threads(1)
    calls: dict[str, dict[str, list]] = {}
    info: dict[str, dict[str, tuple[collections.Counter, int]]] = {}
    gen = torch.Generator().manual_seed(0)
    for spec, engine in engines.items():
        runner = engine._runner
        calls[spec], info[spec] = {}, {}
        intermediate = runner.layers[0].mlp.gate_up_act(torch.zeros(1, runner.hidden_size)).shape[1]
        for part in PARTS:
            modules = (
                [runner.lm_head]
                if part == "lm_head"
                else [getattr(layer.attn if part in ("qkv", "o") else layer.mlp, part) for layer in runner.layers]
            )
            width = intermediate if part == "down" else runner.hidden_size
            x = torch.randn(1, width, generator=gen)
            calls[spec][part] = [(m, x) for m in modules]
            mix: collections.Counter = collections.Counter()
            for m in modules:
                mix.update(_types(m))
            info[spec][part] = (mix, sum(mix.values()))
    times: dict[str, dict[str, list[float]]] = {s: {p: [] for p in PARTS} for s in engines}
    for rep in range(args.reps + 3):  # three warm-up passes
        for part in PARTS:
            for spec in engines:
                t0 = time.perf_counter()
                for module, x in calls[spec][part]:
                    module(x)
                if rep >= 3:
                    times[spec][part].append(time.perf_counter() - t0)
    first = args.files[0]
    print(
        f"\n{args.threads} kernel threads, 1 row, medians of {args.reps} passes; read bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s (all threads); ratio: time / {first}'s"
    )
    print("| part | file | types (share of bytes) | MB | ms/step | GB/s | floor ms | floor / time | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals: dict[str, float] = collections.Counter()
    total_bytes: dict[str, float] = collections.Counter()
    for part in PARTS:
        for spec in engines:
            ms = statistics.median(times[spec][part]) * 1000
            mix, nbytes = info[spec][part]
            base = statistics.median(times[first][part]) * 1000
            totals[spec] += ms
            total_bytes[spec] += nbytes
            floor = nbytes / bandwidth * 1000
            mix_text = ", ".join(f"{t} {n / nbytes:.0%}" for t, n in mix.most_common()) if nbytes else "float32"
            print(
                f"| {part} | {spec} | {mix_text} | {nbytes / 1e6:.1f} | {ms:.3f} | {nbytes / ms / 1e6:.1f} "
                f"| {floor:.3f} | {floor / ms:.2f} | {ms / base:.2f} |"
            )
    for spec in engines:
        floor = total_bytes[spec] / bandwidth * 1000
        print(
            f"| **all parts** | {spec} | - | {total_bytes[spec] / 1e6:.1f} | {totals[spec]:.3f} "
            f"| {total_bytes[spec] / totals[spec] / 1e6:.1f} | {floor:.3f} | {floor / totals[spec]:.2f} "
            f"| {totals[spec] / totals[first]:.2f} |"
        )


if __name__ == "__main__":
    main()
