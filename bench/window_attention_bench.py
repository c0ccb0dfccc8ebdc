"""Sliding-window decode attention: the C kernel with the window against the torch ops it replaced.

Before the kernels took a window, a sliding-window layer (Mistral, Gemma 2/3's local layers, Phi-3-mini) decoded
in `layers/attention.py`'s `attend_torch` (transformers' eager attention, a sequence at a time over its gathered
cache). This runs one decode step's attention for `--layers` layers of Mistral-7B's attention shape (32 query
heads, 8 KV heads of 128, window 4096; `--heads`, `--kv-heads`, `--head-dim`, `--window` change it), blocks of 16
positions shuffled over the pool, float32, for batches of rows and contexts below and past the window, three ways:
the kernel with the window (work O(window) a row), the kernel over the whole context (no window: what a row past
the window would cost without skipping), and `attend_torch`. Best of `--rounds`, milliseconds a step.

    python bench/window_attention_bench.py [--threads 2] [--rounds 5] [--layers 2]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engines.pytorch.layers.attention import Attention, SequenceRows, attend_torch  # noqa: E402
from engines.pytorch.native import HelperThreads  # noqa: E402
from engines.pytorch.paged_attention import DecodeTables, PagedAttention, cache_slots  # noqa: E402

BS = 16
CASES = [(1, 2048), (1, 8192), (1, 16384), (8, 2048), (8, 8192)]  # (rows, context)


def step(rows: int, ctx: int, heads: int, kv_heads: int, dim: int, rnd: random.Random) -> dict:
    """One layer's decode step: `rows` sequences of `ctx` positions each, over shuffled blocks."""
    per = (ctx + BS - 1) // BS
    blocks = list(range(rows * per))
    rnd.shuffle(blocks)
    tables = [blocks[i * per : (i + 1) * per] for i in range(rows)]
    slots = torch.cat([cache_slots(t, BS, ctx) for t in tables])
    return {
        "q": torch.randn(rows, heads, dim),
        "k": torch.randn(rows, kv_heads, dim),
        "v": torch.randn(rows, kv_heads, dim),
        "cos": torch.rand(rows, dim),
        "sin": torch.rand(rows, dim),
        "k_cache": torch.randn(rows * per * BS, kv_heads, dim),
        "v_cache": torch.randn(rows * per * BS, kv_heads, dim),
        "tables": DecodeTables(tables, [ctx] * rows, BS, rows * per),
        "slots": slots.view(rows, ctx)[:, -1],
        "sequences": [SequenceRows(i, 1, ctx - 1, slots.view(rows, ctx)[i]) for i in range(rows)],
    }


def best(fn: Callable[[], object], rounds: int, helpers: HelperThreads) -> float:
    times = []
    for _ in range(rounds + 1):
        helpers.wake()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        helpers.rest()
    return min(times[1:]) * 1e3  # the first warms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="the step's thread and its helpers")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--window", type=int, default=4096)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        helpers = HelperThreads(args.threads - 1, Path(tmp))
        kernel = PagedAttention(args.heads, args.kv_heads, args.head_dim, BS, torch.float32, Path(tmp), helpers=helpers)
        if not kernel.uses_kernel:
            raise SystemExit("no C compiler: nothing to compare")
        attention = Attention(
            layer_idx=0,
            qkv=None,
            o=None,
            num_heads=args.heads,  # type: ignore[arg-type]
            num_kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            scaling=args.head_dim**-0.5,
            sliding_window=args.window,
        )
        helpers.enter()
        print(
            f"decode attention, {args.layers} layers a step, window {args.window}, {args.threads} threads, "
            f"best of {args.rounds} (ms)"
        )
        print(f"{'rows':>4} {'context':>7} {'kernel+window':>13} {'kernel, all':>11} {'torch ops':>9} {'ratio':>6}")
        rnd = random.Random(0)
        for rows, ctx in CASES:
            layers = [step(rows, ctx, args.heads, args.kv_heads, args.head_dim, rnd) for _ in range(args.layers)]

            def run(window: int | None, layers: list[dict] = layers) -> None:
                for x in layers:
                    kernel.decode(
                        x["q"],
                        x["k"],
                        x["v"],
                        x["cos"],
                        x["sin"],
                        x["k_cache"],
                        x["v_cache"],
                        x["tables"],
                        attention.scaling,
                        window,
                    )

            def torch_ops(layers: list[dict] = layers) -> None:
                for x in layers:
                    attend_torch(
                        attention,
                        x["q"],
                        x["k"],
                        x["v"],
                        x["cos"],
                        x["sin"],
                        x["k_cache"],
                        x["v_cache"],
                        x["slots"],
                        x["sequences"],
                    )

            windowed = best(lambda: run(args.window), args.rounds, helpers)
            whole = best(lambda: run(None), args.rounds, helpers)
            eager = best(torch_ops, args.rounds, helpers)
            print(f"{rows:>4} {ctx:>7} {windowed:>13.2f} {whole:>11.2f} {eager:>9.2f} {eager / windowed:>5.1f}x")


if __name__ == "__main__":
    main()
