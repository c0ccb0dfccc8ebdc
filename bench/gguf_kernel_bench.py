"""The GEMM kernel on GGUF blocks against the float32 kernel, per type, side by side in one process.

For every GGUF type the native engine reads from its blocks (engines/pytorch/gguf_blocks.py), one layer's
projections of SmolLM2-135M (q/k/v fused 960 x 576, o 576 x 576, gate/up fused with SiLU 2 x 1536 x 576, down 576 x
1536; the K-quants only down, the one SmolLM2 tensor whose 1536 columns make whole 256-weight super-blocks) are
built twice, for --layers layers (distinct copies: like the model's 30 layers, more than the caches hold, so the
weights stream from memory as in a real step), from the same random weights: once from the blocks (`Linear` /
`GatedActivation` with blocks and no float32 weight) and once from the dequantized float32 weight. Each batch size
is timed round-robin (one call of the set from blocks, one from float32, ...) so that machine noise hits both alike,
and the outputs are checked equal bit for bit. Prints the median time per set, the ratio (float32 time / blocks
time: above 1, the blocks are faster) and the bytes each reads per weight. With --peer (Q4_1, say), the same
projections from that type's blocks join the round robin, and each type's time and bytes per second are put against
the peer's: "time vs peer" is the type's time / the peer's (per weight: the sets have the same shapes), "GB/s vs
peer" its blocks' bytes per second / the peer's (above 1: it streams its bytes faster than the peer does).

    python bench/gguf_kernel_bench.py [--types Q4_0 Q4_K ...] [--rows 1 8 32 512] [--reps 30] [--layers 30]
        [--threads 2]
    python bench/gguf_kernel_bench.py --rows 2048 --layers 2 --reps 5  # prefill-sized steps (compute-bound)
    python bench/gguf_kernel_bench.py --rows 1 --peer Q4_1 --types Q4_0 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K  # per byte
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.pytorch import kernel_modes  # noqa: E402
from engines.pytorch.dense_ops import DenseOps  # noqa: E402
from engines.pytorch.gated_activation import GatedActivation  # noqa: E402
from engines.pytorch.gguf_blocks import TYPES, GGUFBlocks  # noqa: E402
from engines.pytorch.linear import Linear  # noqa: E402
from engines.pytorch.native import HelperThreads  # noqa: E402

HIDDEN, INTERMEDIATE, QKV = 576, 1536, 960


def _blocks(qtype: str, n: int, k: int, rng: np.random.Generator) -> GGUFBlocks:
    """Blocks of a random weight: gguf-py's quantizer where it has one, else random valid block bytes."""
    t = TYPES[qtype]
    if qtype in ("Q4_K", "Q5_K", "Q6_K"):
        raw = rng.integers(0, 256, size=(n, k // 256, t.block_bytes), dtype=np.uint8)
        scales = (rng.standard_normal((n, k // 256, 2)) * 1e-3).astype(np.float16).view(np.uint8).reshape(n, -1, 4)
        if qtype == "Q6_K":
            raw[..., 208:210] = scales[..., :2]
        else:
            raw[..., 0:4] = scales
        return GGUFBlocks(qtype, torch.from_numpy(raw.reshape(n, -1)))
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    weight = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    raw = np.ascontiguousarray(quantize(weight, GGMLQuantizationType[qtype])).view(np.uint8).reshape(n, -1)
    return GGUFBlocks(qtype, torch.from_numpy(raw))


def _layer(from_blocks: bool, blocks: dict, cache: Path, helpers: HelperThreads | None, dense: DenseOps) -> list:
    """One layer's projections as callables of x (hidden or intermediate wide)."""

    def lin(name: str):
        b = blocks[name]
        return (
            Linear(None, None, True, cache, helpers, b)
            if from_blocks
            else Linear(b.dequantize(), None, True, cache, helpers)
        )

    out = [("down", lin("down"))]
    if "qkv" in blocks:
        gate, up = blocks["gate"], blocks["up"]
        act = torch.nn.SiLU()
        mlp = (
            GatedActivation(None, None, act, True, cache, helpers, dense, (gate, up))
            if from_blocks
            else GatedActivation(gate.dequantize(), up.dequantize(), act, True, cache, helpers, dense)
        )
        out += [("qkv", lin("qkv")), ("o", lin("o")), ("gate_up", mlp)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", nargs="+", default=list(TYPES))
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 512])
    parser.add_argument("--reps", type=int, default=30, help="timed calls of each set per batch size")
    parser.add_argument("--layers", type=int, default=30, help="copies of the layer's projections (SmolLM2: 30)")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="kernel threads")
    parser.add_argument("--peer", choices=list(TYPES), help="a type timed beside each (the same shapes)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cache = Path(tempfile.mkdtemp(prefix="gguf-kernel-bench-"))
    helpers = HelperThreads(args.threads - 1, cache) if args.threads > 1 else None
    dense = DenseOps(True, torch.float32, cache, helpers)
    kernel_modes.TILE_UNIT = False  # the register kernels on every CPU and step (the tile unit: Q4_0/Q4_1/Q8_0)
    rng = np.random.default_rng(0)
    print(f"{args.threads} kernel threads; ratio = float32 ms / blocks ms (above 1: blocks faster)")
    print(f"{args.layers} layers per set")
    peer_cols = f" {args.peer} ms | time vs peer | GB/s | GB/s vs peer |" if args.peer else ""
    print(
        "| type | rows | blocks ms | float32 ms | ratio | blocks bytes/weight | float32 bytes/weight | equal |"
        + peer_cols
    )
    print("|---|---|---|---|---|---|---|---|" + "---|" * (4 if args.peer else 0))
    for qtype in args.types:
        shapes = {"down": (HIDDEN, INTERMEDIATE)}
        if TYPES[qtype].record_k <= 32:
            shapes.update(qkv=(QKV, HIDDEN), o=(HIDDEN, HIDDEN), gate=(INTERMEDIATE, HIDDEN), up=(INTERMEDIATE, HIDDEN))
        blocks = {name: _blocks(qtype, n, k, rng) for name, (n, k) in shapes.items()}
        weights = sum(n * k for n, k in shapes.values())
        sets = {
            kind: [
                p
                for _ in range(args.layers)
                for p in _layer(
                    kind == "blocks",
                    {n: GGUFBlocks(b.qtype, b.raw.clone()) for n, b in blocks.items()},
                    cache,
                    helpers,
                    dense,
                )
            ]
            for kind in ("blocks", "float32")
        }
        nbytes = sum(b.nbytes for b in blocks.values())
        peer_bytes = 0
        if args.peer:
            peer = {name: _blocks(args.peer, n, k, rng) for name, (n, k) in shapes.items()}
            peer_bytes = sum(b.nbytes for b in peer.values())
            sets["peer"] = [
                p
                for _ in range(args.layers)
                for p in _layer(
                    True, {n: GGUFBlocks(b.qtype, b.raw.clone()) for n, b in peer.items()}, cache, helpers, dense
                )
            ]
        for rows in args.rows:
            xs = {w: torch.randn(rows, w) for w in (HIDDEN, INTERMEDIATE)}

            def run(kind: str) -> list[torch.Tensor]:  # called in this iteration only
                return [fn(xs[INTERMEDIATE if name == "down" else HIDDEN]) for name, fn in sets[kind]]  # noqa: B023

            equal = all(torch.equal(a, b) for a, b in zip(run("blocks"), run("float32"), strict=True))
            times: dict[str, list[float]] = {kind: [] for kind in sets}
            for _ in range(args.reps + 2):
                for kind in times:
                    t0 = time.perf_counter()
                    run(kind)
                    times[kind].append(time.perf_counter() - t0)
            ms = {kind: statistics.median(t[2:]) * 1000 for kind, t in times.items()}
            peer_row = ""
            if args.peer:
                gbs = nbytes * args.layers / ms["blocks"] / 1e6
                peer_row = (
                    f" {ms['peer']:.3f} | {ms['blocks'] / ms['peer']:.2f} | {gbs:.2f} "
                    f"| {gbs / (peer_bytes * args.layers / ms['peer'] / 1e6):.2f} |"
                )
            print(
                f"| {qtype} | {rows} | {ms['blocks']:.3f} | {ms['float32']:.3f} | {ms['float32'] / ms['blocks']:.2f} "
                f"| {nbytes / weights:.4f} | 4 | {equal} |{peer_row}",
                flush=True,
            )


if __name__ == "__main__":
    main()
