"""Decode attention, this tree's C kernel against another revision's, side by side in one run.

The kernel (`paged_decode_f32`, engines/pytorch/csrc/paged_attention_typed.h) runs the decode rows of one step for
30 layers (SmolLM2's shape: 9 query heads, 3 KV heads of 64, blocks of 16 positions, float32 cache; each layer its
own cache, shuffled blocks, so the step reads memory as the engine's does) on the helper-thread pool, for batches
of rows and context lengths that a chat at c=1, a long document, a speculative verification step (rows of one
sequence at consecutive positions) and a batched server see. Both builds
(this tree's sources and `--against`'s, from git) get the same arguments, in alternating order; the best of
`--rounds` per build is printed with the ratio.

    python bench/decode_attention_bench.py [--against HEAD] [--threads 2] [--rounds 15]
"""

from __future__ import annotations

import argparse
import ctypes
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engines.pytorch.native import CSRC, HelperThreads, _build  # noqa: E402
from engines.pytorch.paged_attention import _SIGNATURES, DecodeTables  # noqa: E402

H, KVH, D, BS, LAYERS = 9, 3, 64, 16, 30
# (rows, context, rows of one sequence: a verification step's consecutive positions, else one sequence a row)
CASES = [
    (1, 128, False),
    (1, 512, False),
    (1, 2048, False),
    (1, 8192, False),
    (6, 512, True),
    (6, 2048, True),
    (6, 8192, True),
    (6, 512, False),
    (8, 512, False),
    (32, 256, False),
    (32, 1024, False),
]


def sources_at(rev: str, folder: Path) -> Path:
    """The kernel sources of revision `rev` in `folder`."""
    csrc = CSRC.relative_to(ROOT)
    names = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}:{csrc}"], check=True, capture_output=True, text=True
    ).stdout.split()
    for name in names:
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:{csrc}/{name}"], check=True, capture_output=True
        ).stdout
        (folder / name).write_bytes(text)
    return folder


def library(source_dir: Path, cache: Path, helpers: HelperThreads) -> tuple[ctypes.CDLL, bool]:
    """The build of `source_dir`'s kernels, and whether its decode takes a window and a soft-cap."""
    path = _build("paged_attention", source_dir, cache)
    if path is None:
        raise SystemExit("no C compiler: nothing to compare")
    lib = ctypes.CDLL(str(path))
    windowed = "softcap" in (source_dir / "paged_attention_typed.h").read_text()
    for fn, (restype, argtypes) in _SIGNATURES.items():
        if hasattr(lib, fn):  # an older revision lacks the newer entry points
            if not windowed and fn.startswith(("paged_decode", "paged_prefill")):  # nor the window and the cap
                skip = WINDOW_ARGS["paged_decode" if fn.startswith("paged_decode") else "paged_prefill_run"]
                argtypes = [t for i, t in enumerate(argtypes) if i not in skip]
            getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, argtypes
    helpers.attach(lib)
    return lib, windowed


# the window's and the soft-cap's argument positions, which revisions before them lack
WINDOW_ARGS = {"paged_decode": {20, 21}, "paged_prefill_run": {21, 22}}


def shared_decode(lib: ctypes.CDLL, windowed: bool) -> Callable[..., int]:
    """The decode kernel on the helper threads, without a window: `paged_decode_f32(..., 0, 0.0, share=1)`, or in
    revisions before the window `(..., share=1)`, before `share` `paged_decode_par_f32`."""
    if hasattr(lib, "paged_decode_par_f32"):
        fn = lib.paged_decode_par_f32
        fn.restype, fn.argtypes = ctypes.c_int, _SIGNATURES["paged_decode_f32"][1][:20]
        return fn
    if windowed:
        return lambda *args: lib.paged_decode_f32(*args, 0, 0.0, 1)
    return lambda *args: lib.paged_decode_f32(*args, 1)


def layer(batch: int, ctx: int, verify: bool, rnd: random.Random) -> tuple[tuple, list]:
    """One layer's arguments for `batch` rows of `ctx` positions (`verify`: rows at positions ctx - 1 .. of one
    sequence), and the tensors they point into."""
    per = (ctx + batch + BS - 1) // BS
    seqs = 1 if verify else batch
    blocks = list(range(seqs * per))
    rnd.shuffle(blocks)
    tables = [blocks[(0 if verify else i) * per : ((0 if verify else i) + 1) * per] for i in range(batch)]
    tables = DecodeTables(tables, [ctx + i if verify else ctx for i in range(batch)], BS, seqs * per)
    kc, vc = torch.randn(seqs * per * BS, KVH, D), torch.randn(seqs * per * BS, KVH, D)
    q, k, v = torch.randn(batch, H, D), torch.randn(batch, KVH, D), torch.randn(batch, KVH, D)
    cos, sin, out = torch.rand(batch, D), torch.rand(batch, D), torch.empty(batch, H * D)
    args = (
        q.data_ptr(),
        q.stride(0),
        k.data_ptr(),
        k.stride(0),
        v.data_ptr(),
        v.stride(0),
        cos.data_ptr(),
        sin.data_ptr(),
        kc.data_ptr(),
        vc.data_ptr(),
        tables.tables.data_ptr(),
        tables.tables.shape[1],
        tables.ctx_lens.data_ptr(),
        out.data_ptr(),
        batch,
        H,
        KVH,
        D,
        BS,
        D**-0.5,
    )
    return args, [kc, vc, q, k, v, cos, sin, out, tables]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default="HEAD", help="git revision whose kernel is the baseline")
    parser.add_argument("--threads", type=int, default=2, help="the step's thread and its helpers")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp)
        helpers = HelperThreads(args.threads - 1, cache)
        base = library(sources_at(args.against, Path(tempfile.mkdtemp(dir=tmp))), cache, helpers)
        libs = {args.against: shared_decode(*base), "this tree": shared_decode(*library(CSRC, cache, helpers))}
        helpers.enter()
        print(f"decode attention, {LAYERS} layers a step, {args.threads} threads, best of {args.rounds} (ms)")
        print(f"{'rows':>4} {'context':>7} {'of':>9} {args.against:>12} {'this tree':>10} {'ratio':>6}")
        rnd = random.Random(0)
        for batch, ctx, verify in CASES:
            layers = [layer(batch, ctx, verify, rnd) for _ in range(LAYERS)]
            best = dict.fromkeys(libs, float("inf"))
            for r in range(args.rounds + 1):
                for name in list(libs)[:: 1 if r % 2 else -1]:
                    helpers.wake()
                    t0 = time.perf_counter()
                    for call, _ in layers:
                        if libs[name](*call) != 0:
                            raise MemoryError("the kernel could not allocate")
                    elapsed = time.perf_counter() - t0
                    helpers.rest()
                    if r:  # the first round warms both
                        best[name] = min(best[name], elapsed)
            old, new = best[args.against], best["this tree"]
            of = "1 seq" if verify or batch == 1 else f"{batch} seqs"
            print(f"{batch:>4} {ctx:>7} {of:>9} {old * 1e3:>12.3f} {new * 1e3:>10.3f} {old / new:>5.2f}x", flush=True)


if __name__ == "__main__":
    main()
