"""Refuse a model whose weights cannot fit in the memory this process may still use, before any weight is read.

Why: loading weights larger than free memory does not fail cleanly. The kernel's OOM killer ends the whole server
partway through the load (every other model and every stream with it), or a cgroup limit does the same to the
container. So the native engine first estimates the weights' bytes from the files' headers (the GGUF tensor table,
the safetensors headers; nothing is read past them) and compares them with what the process may still allocate:
`MemAvailable` from /proc/meminfo and, under a cgroup memory limit (v2 `memory.max`, v1 `memory.limit_in_bytes`),
the limit less the group's working set (usage less its inactive file pages, which the kernel reclaims first),
whichever is smaller. Past it the load fails with `InsufficientMemoryError`, naming both figures and the fixes.

The estimate counts the weights as the engine holds them (GGUF blocks as stored, float weights in the configured
dtype); the KV pool is allocated lazily (host_memory.py) and is not counted.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from engines.cpu_budget import CGROUP_ROOT, PROC_CGROUP
from engines.interface import InsufficientMemoryError

MEMINFO = Path("/proc/meminfo")
MAX_SAFETENSORS_HEADER = 100 << 20  # the format's own bound on a header
# bytes per element of safetensors dtypes (the ones weights come in)
_ST_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Available:
    """Bytes this process may still allocate, and where that figure comes from."""

    bytes: int
    source: str


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _meminfo_available(meminfo: Path) -> int | None:
    for line in (_read(meminfo) or "").splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            return int(parts[1]) * 1024 if len(parts) >= 2 and parts[1].isdigit() else None
    return None


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def _inactive_file(stat_text: str | None, key: str) -> int:
    for line in (stat_text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _cgroup_room(proc_cgroup: Path, cgroup_root: Path) -> Available | None:
    """The tightest (limit - working set) over this process's memory cgroup and its ancestors, v2 or v1."""
    text = _read(proc_cgroup)
    if text is None:
        return None
    rooms: list[Available] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        parts = [p for p in path.split("/") if p]
        if hierarchy == "0" and controllers == "":
            mounts = [m for m in (cgroup_root, cgroup_root / "unified") if (m / "cgroup.controllers").is_file()]
            files = ("memory.max", "memory.current", "inactive_file")
        elif "memory" in controllers.split(","):
            mounts = [cgroup_root / "memory"]
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        for mount in mounts[:1]:
            for i in range(len(parts), -1, -1):
                folder = mount.joinpath(*parts[:i])
                limit, usage = _int(_read(folder / files[0])), _int(_read(folder / files[1]))
                if limit is None or usage is None or limit >= 1 << 60:  # "max", or v1's "no limit" (near 2**63)
                    continue
                working = max(0, usage - _inactive_file(_read(folder / "memory.stat"), files[2]))
                rooms.append(Available(max(0, limit - working), f"the cgroup memory limit ({folder / files[0]})"))
    return min(rooms, key=lambda a: a.bytes, default=None)


def available_memory(
    meminfo: Path = MEMINFO, proc_cgroup: Path = PROC_CGROUP, cgroup_root: Path = CGROUP_ROOT
) -> Available | None:
    """What this process may still allocate; None where neither figure can be read (then nothing is checked)."""
    found = []
    system = _meminfo_available(meminfo)
    if system is not None:
        found.append(Available(system, "MemAvailable in /proc/meminfo"))
    room = _cgroup_room(proc_cgroup, cgroup_root)
    if room is not None:
        found.append(room)
    return min(found, key=lambda a: a.bytes, default=None)


def safetensors_bytes(path: Path, dtype: str | None) -> int:
    """The tensors of one safetensors file, from its header: in `dtype` when given (float tensors are converted to
    it on load), else as stored. The file size for a header that cannot be read (the loader then says why)."""
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > MAX_SAFETENSORS_HEADER:
                return path.stat().st_size
            header = json.loads(f.read(length))
    except (OSError, struct.error, ValueError):
        return path.stat().st_size
    total = 0
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        stored = info.get("dtype")
        shape = info.get("shape") or []
        if not isinstance(stored, str) or not all(isinstance(d, int) and d >= 0 for d in shape):
            continue
        size = _ST_BYTES.get(stored, 4)
        if dtype is not None and stored in ("F64", "F32", "F16", "BF16"):
            size = DTYPE_BYTES[dtype]
        total += math.prod(shape) * size
    return total


def gguf_bytes(gguf: Path, dtype: str, as_blocks: bool) -> int:
    """A GGUF file's weights as the engine will hold them: its blocks as stored (`as_blocks`, the native block
    path), else every tensor dequantized to `dtype`. Reads the tensor table only (gguf_file.read_layout, which
    raises ModelFileError for a bad file)."""
    from engines.pytorch.gguf_file import read_layout

    tensors = read_layout(gguf).tensors.values()
    if as_blocks:
        return sum(t.nbytes for t in tensors)
    return sum(math.prod(t.shape) for t in tensors) * DTYPE_BYTES[dtype]


def folder_bytes(folder: Path, dtype: str) -> int:
    """An HF folder's weights in `dtype`: its safetensors files' tensors, else its PyTorch .bin files' sizes."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return sum(safetensors_bytes(f, dtype) for f in files)
    return sum(f.stat().st_size for f in folder.glob("*.bin"))


def weight_bytes(source: Path, gguf: Path, dtype: str, as_blocks: bool) -> int | None:
    """The weights' bytes of a model at `source` (`gguf`: its GGUF file, or `source` itself); None when the
    source is neither a GGUF file nor a folder (the loader says why)."""
    if gguf.is_file() and gguf.suffix == ".gguf":
        return gguf_bytes(gguf, dtype, as_blocks)
    if source.is_dir():
        return folder_bytes(source, dtype)
    return None


def check_fits(name: str, weight_bytes: int, available: Available | None = None) -> None:
    """Raise InsufficientMemoryError when `weight_bytes` exceed what this process may still allocate."""
    room = available if available is not None else available_memory()
    if room is None or weight_bytes <= room.bytes:
        return
    raise InsufficientMemoryError(
        f"{name}: its weights need about {weight_bytes / 2**30:.2f} GiB but only {room.bytes / 2**30:.2f} GiB is "
        f"available ({room.source}); the load was refused before reading them. Free memory (unload another "
        "model), raise the memory limit, or serve a smaller quantization (a GGUF file with fast_kernels keeps "
        "its blocks as they are)."
    )
