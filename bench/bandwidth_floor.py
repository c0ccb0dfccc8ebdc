"""The memory bandwidth floor of a decode step, and the engine's fraction of it.

A decode step at batch 1 must read every weight it uses once, so its time cannot be below (bytes of weights a
token reads) / (the machine's read bandwidth). That floor only means something when the weights come from memory:
a VM whose last-level cache is 480 MiB holds SmolLM2-135M's 97 MB of blocks whole, and a "fraction of the floor"
measured on it compares the step with the memory while the step reads the cache. So here:

- the bandwidth is read on the engine's own memory layout (a buffer from engines/pytorch/host_memory.py, 2 MiB
  pages where the OS gives them, as the engine's packed weights have) with a working set several times the
  last-level cache (`--mib`, default 4x the cache and at least 1 GiB), by `--threads` threads each reading its
  contiguous share with vector loads (bench/read_bandwidth.c, built here with the system C compiler);
  `--small-pages` also reads a 4 KiB-page buffer of the same size, to show what the page size is worth;
- the engine's fraction is taken on a model that does not fit in that cache (`--model llama-1b`, a random-weight
  file with Llama-3.2-1B's shapes from bench/real_size_models.py, or `--gguf FILE`): the bytes of weights one
  decode token reads (every layer tensor, the final norm and the lm_head from the file's tensor sizes; of a
  mixture of experts only the experts a token uses, expert_used_count of expert_count) over the engine's median
  time of a decode step at batch 1 (in this process, no HTTP, `pytorch.gemm_threads` = `--threads`, after a
  128-token prompt), divided by the bandwidth (the best of the measures before and after the steps).

    python bench/bandwidth_floor.py [--threads 2] [--mib N] [--small-pages] [--model llama-1b | --gguf FILE]
        [--steps 32]
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HUGE = 2 << 20


def last_level_cache_bytes() -> int:
    """The largest cache of CPU 0 (sysfs), or 0 when the system does not say."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        best = max(best, int(text.rstrip("KMG")) * scale)
    return best


def _reader() -> ctypes.CDLL:
    """bench/read_bandwidth.c, compiled for this CPU into a temporary folder."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("no C compiler (cc) to build bench/read_bandwidth.c")
    folder = Path(tempfile.mkdtemp(prefix="read-bandwidth-"))
    lib = folder / "read_bandwidth.so"
    subprocess.run(
        [
            cc,
            "-O3",
            "-march=native",
            "-shared",
            "-fPIC",
            "-pthread",
            "-o",
            str(lib),
            str(ROOT / "bench" / "read_bandwidth.c"),
        ],
        check=True,
    )
    dll = ctypes.CDLL(str(lib))
    dll.read_passes.restype = ctypes.c_double
    dll.read_passes.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_uint64),
    ]
    shutil.rmtree(folder, ignore_errors=True)  # the library stays mapped
    return dll


def huge_kib_at(address: int) -> int | None:
    """AnonHugePages (KiB) of the mapping that holds `address`, from /proc/self/smaps; None without it."""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= address < end
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return None


class Bandwidth:
    """A buffer of `nbytes` on the engine's pages (or on 4 KiB pages with `small_pages`), read on demand."""

    def __init__(self, nbytes: int, small_pages: bool = False) -> None:
        import torch

        from engines.pytorch import host_memory

        self.nbytes = nbytes // HUGE * HUGE
        self._dll = _reader()
        if small_pages:
            self._map = mmap.mmap(-1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if hasattr(mmap, "MADV_NOHUGEPAGE"):
                self._map.madvise(mmap.MADV_NOHUGEPAGE)
            self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)
        else:
            self.tensor = host_memory.zeros((self.nbytes,), torch.uint8)
        self.tensor.fill_(1)  # fault every page in before timing
        self.huge_kib = huge_kib_at(self.tensor.data_ptr())

    def read(self, threads: int, reps: int = 8) -> float:
        """Bytes per second: the best of `reps` passes over the buffer on `threads` threads."""
        checksum = ctypes.c_uint64()
        seconds = self._dll.read_passes(self.tensor.data_ptr(), self.nbytes, threads, reps, ctypes.byref(checksum))
        if checksum.value != self.nbytes // 8 * 0x0101010101010101 % 2**64:
            raise RuntimeError("read_bandwidth.c summed the buffer wrong")
        return self.nbytes / seconds


def decode_bytes(gguf: Path) -> dict[str, int]:
    """Bytes of weights one decode token reads, from the file's tensor sizes: every layer tensor (of expert tensors,
    the share of the experts a token uses), the final norm and the lm_head (`output.weight`, or the tied
    `token_embd.weight` when there is none); the embedding lookup itself reads one row, which is left out."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    fields = {f.name: f for f in reader.fields.values()}
    arch = fields["general.architecture"].contents()
    used, count = (fields.get(f"{arch}.{key}") for key in ("expert_used_count", "expert_count"))
    share = (used.contents() / count.contents()) if used and count and count.contents() else 1.0
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    lm_head = sizes.get("output.weight", sizes.get("token_embd.weight", 0))
    experts = sum(n for name, n in sizes.items() if name.startswith("blk.") and "_exps." in name)
    layers = sum(n for name, n in sizes.items() if name.startswith("blk.") and "_exps." not in name)
    layers += round(experts * share)
    norms = sum(n for name, n in sizes.items() if not name.startswith("blk.") and name.endswith("norm.weight"))
    return {
        "layers": layers,
        "lm_head": lm_head,
        "norms": norms,
        "total": layers + lm_head + norms,
        "experts_all": experts,
        "expert_share": share,
    }


def decode_step_seconds(gguf: Path, threads: int, steps: int, prompt_len: int = 128) -> float:
    """The engine's median time of a decode step at batch 1, in this process (no HTTP)."""
    from bench.engine_step_bench import BLOCK, _Seqs
    from engines.pytorch.engine import PyTorchEngine

    max_len = prompt_len + steps + 8
    engine = PyTorchEngine(
        gguf,
        dtype="float32",
        kv_cache_tokens=(max_len // BLOCK + 2) * BLOCK,
        block_size=BLOCK,
        gemm_threads=threads,
        max_model_len=max_len + BLOCK,
    )
    seqs = _Seqs(1, prompt_len, max_len, max_len // BLOCK + 2, seed=1)
    while seqs.pos[0] < prompt_len:
        batch = seqs.steps()
        seqs.advance(batch, engine.execute(batch).token_ids)
    times = []
    for _ in range(2 + steps):  # two warm-up steps
        batch = seqs.steps()
        start = time.perf_counter()
        result = engine.execute(batch)
        times.append(time.perf_counter() - start)
        seqs.advance(batch, result.token_ids)
    return statistics.median(times[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--threads", type=int, default=2, help="reading threads, and the engine's (default: %(default)s)"
    )
    parser.add_argument("--mib", type=int, help="working set in MiB (default: 4x the last-level cache, at least 1024)")
    parser.add_argument("--small-pages", action="store_true", help="also read a buffer on 4 KiB pages")
    parser.add_argument(
        "--reps", type=int, default=8, help="passes per measure; the best counts (default: %(default)s)"
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--model", help="a model of bench/real_size_models.py (llama-1b, ...), made if missing")
    group.add_argument("--gguf", type=Path, help="a GGUF file to take the engine's fraction on")
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps (default: %(default)s)")
    args = parser.parse_args()

    llc = last_level_cache_bytes()
    nbytes = (args.mib << 20) if args.mib else max(4 * llc, 1 << 30)
    if llc and nbytes <= llc:
        print(
            f"warning: a {nbytes >> 20} MiB working set fits the {llc >> 20} MiB last-level cache: this measures "
            "the cache, not memory",
            flush=True,
        )
    buf = Bandwidth(nbytes)
    before = buf.read(args.threads, args.reps)
    huge = f"{buf.huge_kib >> 10} MiB of it on 2 MiB pages" if buf.huge_kib is not None else "page size unknown"
    print(
        f"last-level cache {llc >> 20} MiB; working set {buf.nbytes >> 20} MiB from the engine's allocator "
        f"({huge}); {args.threads} threads: {before / 1e9:.1f} GB/s",
        flush=True,
    )
    if args.small_pages:
        small = Bandwidth(nbytes, small_pages=True)
        print(
            f"the same on 4 KiB pages ({(small.huge_kib or 0) >> 10} MiB on 2 MiB pages): "
            f"{small.read(args.threads, args.reps) / 1e9:.1f} GB/s",
            flush=True,
        )
        del small
    gguf = args.gguf
    if args.model:
        from bench.real_size_models import model_file

        gguf = model_file(args.model)
    if gguf is None:
        return
    weights = decode_bytes(gguf)
    share = (
        f"; experts: {weights['expert_share']:.3f} of {weights['experts_all'] / 1e6:.0f} MB"
        if weights["experts_all"]
        else ""
    )
    print(
        f"{gguf.name}: {gguf.stat().st_size / 1e6:.0f} MB; a decode token reads {weights['total'] / 1e6:.1f} MB of "
        f"weights (layers {weights['layers'] / 1e6:.1f}, lm_head {weights['lm_head'] / 1e6:.1f}{share})",
        flush=True,
    )
    if llc and weights["total"] <= llc:
        print(
            f"warning: {weights['total'] >> 20} MiB of weights fit the {llc >> 20} MiB cache: not a floor", flush=True
        )
    step = decode_step_seconds(gguf, args.threads, args.steps)
    after = buf.read(args.threads, args.reps)
    bandwidth = max(before, after)
    floor = weights["total"] / bandwidth
    print(
        f"read bandwidth before / after the steps: {before / 1e9:.1f} / {after / 1e9:.1f} GB/s; floor "
        f"{floor * 1000:.2f} ms a token ({1 / floor:.1f} tok/s)"
    )
    print(
        f"engine decode step at batch 1 (median of {args.steps}): {step * 1000:.2f} ms ({1 / step:.1f} tok/s); "
        f"weights read at {weights['total'] / step / 1e9:.1f} GB/s: {floor / step:.2f} of the floor"
    )


if __name__ == "__main__":
    main()
