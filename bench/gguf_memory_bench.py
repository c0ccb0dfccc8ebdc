"""Memory and batch-1 decode speed of the native engine on SmolLM2 GGUF files of every quantization.

For each type (bench/gguf_files.py makes the files from the shipped Q4_1 one), a fresh process builds a
`PyTorchEngine` on the file (float32, the default fast kernels) after a first process has filled the engine's
caches (the GGUF's float32 conversion, the saved blocks), as at any start after the first. It prints:
- file MB: the GGUF file's size;
- held MB: the bytes of every tensor the engine holds for its weights (blocks and float tensors alike, each storage
  once; the KV cache not counted), and of those, float MB: float32/bfloat16/float16 tensors of a megabyte or more
  (weights left in float, which the blocks should make unnecessary);
- B/weight: held bytes per weight of the model (the file's bytes per weight beside it);
- RSS MB: the process's resident memory after the engine is built minus before (torch, transformers and its llama
  model classes imported already: about 180 MB whatever the model): the weights, the tokenizer (40-60 MB), the KV
  pages touched and the allocator's slack; peak MB: its peak resident memory while building (VmHWM), minus the
  same base: what loading needs beyond what the engine then holds (no float32 model is built: loader.py), and
  peak / file, the figure that says whether a larger model's file loads on a given machine;
- tok/s: c=1 greedy decode, 128 tokens after a 64-token prompt, one `execute` per token on `--threads` threads
  (median of `--repeats` runs; the step only, no HTTP, no scheduler).

    python bench/gguf_memory_bench.py [--types Q4_K_M Q4_1 ...] [--threads 2] [--tokens 128] [--repeats 3]

Types whose file cannot be made here (the K mixes need llama-cpp-python) are listed as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gguf_files import ALL_TYPES, QuantizerMissing, quantized, shipped_gguf  # noqa: E402

BLOCK = 16


def _status(field: str) -> int:
    """A /proc/self/status size in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux 4.0+); False where it cannot be."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _decode_tok_s(engine: Any, tokens: int, repeats: int, prompt_len: int = 64) -> tuple[float, list[int]]:
    """Median tok/s of `repeats` greedy c=1 decodes of `tokens` tokens (prefill not timed), and the tokens of the
    first (the same every run: greedy)."""
    from engines.types import SamplingParams, SequenceStep

    rng = random.Random(0)
    prompt = [rng.randrange(100, 40000) for _ in range(prompt_len)]
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    table = list(range((prompt_len + tokens + BLOCK) // BLOCK + 1))
    rates, first = [], None
    for r in range(repeats):
        seq = f"r{r}"
        history = list(prompt)
        new = list(prompt)
        elapsed = 0.0
        for i in range(tokens + 1):  # the first step is the prefill
            step = SequenceStep(
                seq,
                new,
                len(history) - len(new),
                table,
                True,
                params,
                list(history),
                prompt_len,
                len(history) - prompt_len,
            )
            t0 = time.perf_counter()
            result = engine.execute([step])
            if i:
                elapsed += time.perf_counter() - t0
            token = result.token_ids[seq]
            history.append(token)
            new = [token]
        engine.release(seq)
        rates.append(tokens / elapsed)
        first = first or history[prompt_len:]
    return statistics.median(rates), first


def measure(path: Path, threads: int, tokens: int, repeats: int) -> dict:
    """Build the engine on `path` in this process and measure it (see the module's docstring)."""
    import gc

    # what any engine imports, whatever its model (about 180 MB of code and objects here), before the base
    import transformers.models.llama.modeling_llama  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    from engines.pytorch.engine import PyTorchEngine
    from engines.pytorch.weight_memory import float_weights, runner_weights

    gc.collect()
    base = _status("VmRSS")
    peak_ok = _reset_peak()
    t0 = time.perf_counter()
    engine = PyTorchEngine(path, dtype="float32", kv_cache_tokens=1024, block_size=BLOCK, gemm_threads=threads)
    build_s = time.perf_counter() - t0
    gc.collect()
    rss = _status("VmRSS") - base
    peak = _status("VmHWM") - base if peak_ok else None
    held = runner_weights(engine._runner)
    total = sum(h.nbytes for h in held.values())
    floats = sum(h.nbytes for h in float_weights(held))
    tok_s, out = _decode_tok_s(engine, tokens, repeats)
    return {
        "held": total,
        "float": floats,
        "rss": rss,
        "peak": peak,
        "build_s": build_s,
        "tok_s": tok_s,
        "rss_after_decode": _status("VmRSS") - base,
        "tokens": out,
    }


def _weights(source: Path) -> int:
    """The number of weights in the model (all its tensors' elements)."""
    import gguf

    return sum(int(t.n_elements) for t in gguf.GGUFReader(str(source)).tensors)


def _child(path: Path, args: argparse.Namespace, prepare: bool) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(path),
        "--threads",
        str(args.threads),
        "--tokens",
        str(2 if prepare else args.tokens),
        "--repeats",
        str(1 if prepare else args.repeats),
    ]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"measuring {path.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", nargs="+", default=list(ALL_TYPES), choices=ALL_TYPES, metavar="TYPE")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shipped", action="store_true", help="also the shipped file (Q4_1 projections, Q8_0 head)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.child:
        print(json.dumps(measure(args.child, args.threads, args.tokens, args.repeats)))
        return
    source = shipped_gguf()
    weights = _weights(source)
    files: list[tuple[str, Path]] = [("shipped", source)] if args.shipped else []
    for kind in args.types:
        try:
            files.append((kind, quantized(kind)))
        except QuantizerMissing as exc:
            print(f"{kind}: skipped ({exc})", flush=True)
    print(
        f"{weights / 1e6:.1f} M weights; {args.threads} threads, c=1 decode of {args.tokens} tokens, "
        f"median of {args.repeats}",
        flush=True,
    )
    rows = []
    for kind, path in files:
        _child(path, args, prepare=True)  # fills the caches a later start reads
        r = _child(path, args, prepare=False)
        size = path.stat().st_size
        rows.append((kind, size, r))
        peak = f"peak {r['peak'] / 1e6:.1f} MB, " if r["peak"] is not None else ""
        print(
            f"{kind}: built in {r['build_s']:.1f} s, held {r['held'] / 1e6:.1f} MB, "
            f"RSS {r['rss'] / 1e6:.1f} MB, {peak}{r['tok_s']:.1f} tok/s",
            flush=True,
        )
    print(
        "\n| type | file MB | held MB | float MB | B/weight held | B/weight file | RSS MB | held / file "
        "| RSS / file | peak MB | peak / file | tok/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, size, r in rows:
        peak = f"{r['peak'] / 1e6:.0f} | {r['peak'] / size:.2f}" if r["peak"] is not None else "- | -"
        print(
            f"| {kind} | {size / 1e6:.1f} | {r['held'] / 1e6:.1f} | {r['float'] / 1e6:.1f} "
            f"| {r['held'] / weights:.2f} | {size / weights:.2f} | {r['rss'] / 1e6:.1f} | {r['held'] / size:.2f} "
            f"| {r['rss'] / size:.2f} | {peak} | {r['tok_s']:.1f} |"
        )


if __name__ == "__main__":
    main()
