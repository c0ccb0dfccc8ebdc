"""The pre-load memory check: what the process may still allocate (MemAvailable, cgroup v1 and v2 limits), what a
model's weights need (from headers only), and the refusal of a model that does not fit, with its figures."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from engines.interface import InsufficientMemoryError, UnsupportedModelError
from engines.pytorch.memory_check import Available, available_memory, check_fits, folder_bytes, safetensors_bytes

GIB = 2**30


def write_meminfo(tmp: Path, available_kib: int) -> Path:
    path = tmp / "meminfo"
    path.write_text(f"MemTotal:       64000000 kB\nMemFree:         1000000 kB\nMemAvailable:   {available_kib} kB\n")
    return path


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], sparse: bool = True) -> int:
    """A safetensors file whose header declares `tensors` (name -> dtype, shape); the data is a hole (sparse)."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)  # no data written: a huge file costs no disk
    return offset


def test_meminfo_alone_and_under_a_tighter_cgroup_v1_limit(tmp_path: Path) -> None:
    meminfo = write_meminfo(tmp_path, 8 * 1024 * 1024)  # 8 GiB
    none = tmp_path / "no-cgroup"
    assert available_memory(meminfo, none, tmp_path) == Available(8 * GIB, "MemAvailable in /proc/meminfo")

    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/pod/app\n0::/\n")
    group = tmp_path / "memory" / "pod" / "app"
    group.mkdir(parents=True)
    (group / "memory.limit_in_bytes").write_text(str(3 * GIB))
    (group / "memory.usage_in_bytes").write_text(str(2 * GIB))
    (group / "memory.stat").write_text(f"cache 100\ntotal_inactive_file {GIB // 2}\n")
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712")  # the root: no limit
    (tmp_path / "memory" / "memory.usage_in_bytes").write_text(str(40 * GIB))
    room = available_memory(meminfo, proc, tmp_path)
    assert room is not None and room.bytes == 3 * GIB - (2 * GIB - GIB // 2)  # inactive file pages are reclaimable
    assert "cgroup memory limit" in room.source


def test_a_cgroup_v2_limit(tmp_path: Path) -> None:
    meminfo = write_meminfo(tmp_path, 8 * 1024 * 1024)
    proc = tmp_path / "cgroup"
    proc.write_text("0::/kubepods/pod1\n")
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    group = tmp_path / "kubepods" / "pod1"
    group.mkdir(parents=True)
    (group / "memory.max").write_text(f"{GIB}\n")
    (group / "memory.current").write_text(f"{GIB // 4}\n")
    (tmp_path / "kubepods" / "memory.max").write_text("max\n")
    room = available_memory(meminfo, proc, tmp_path)
    assert room is not None and room.bytes == GIB - GIB // 4


def test_weights_are_counted_from_the_headers_in_the_served_dtype(tmp_path: Path) -> None:
    stored = write_safetensors(
        tmp_path / "model.safetensors", {"a": ("F32", [1024, 1024]), "b": ("BF16", [10]), "ids": ("I8", [16])}
    )
    assert stored == 4 * 1024 * 1024 + 20 + 16
    assert safetensors_bytes(tmp_path / "model.safetensors", None) == stored
    assert safetensors_bytes(tmp_path / "model.safetensors", "bfloat16") == 2 * 1024 * 1024 + 20 + 16
    assert folder_bytes(tmp_path, "float32") == 4 * 1024 * 1024 + 40 + 16
    (tmp_path / "broken.safetensors").write_bytes(b"\xff" * 16)  # unreadable header: its size, the loader says why
    assert safetensors_bytes(tmp_path / "broken.safetensors", "float32") == 16


def test_a_model_larger_than_the_room_is_refused_with_both_figures() -> None:
    check_fits("small.gguf", GIB, Available(2 * GIB, "MemAvailable in /proc/meminfo"))
    with pytest.raises(InsufficientMemoryError) as refused:
        check_fits("big.gguf", 5 * GIB, Available(2 * GIB, "MemAvailable in /proc/meminfo"))
    assert isinstance(refused.value, UnsupportedModelError)  # the gateway reports it as the model's load failure
    message = str(refused.value)
    assert "big.gguf" in message and "5.00 GiB" in message and "2.00 GiB" in message and "MemAvailable" in message


def test_the_engine_refuses_before_reading_a_weight(tmp_path: Path) -> None:
    from engines.pytorch.engine import PyTorchEngine

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    room = available_memory()
    assert room is not None
    rows = (room.bytes * 2) // (4 * 16384) + 1  # twice what this machine has left, as float32
    write_safetensors(tmp_path / "model.safetensors", {"model.embed_tokens.weight": ("F32", [rows, 16384])})
    with pytest.raises(InsufficientMemoryError, match="GiB"):
        PyTorchEngine(tmp_path, dtype="float32")
