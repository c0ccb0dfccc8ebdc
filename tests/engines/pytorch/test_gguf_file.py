"""gguf_file.read_layout reads a GGUF file's table as gguf-py does, and refuses, naming the tensor, one whose bytes
lie past the end of the file or whose type is unknown, on a small file written with gguf-py (the loader's own tests
of damaged files are test_gguf_bad_files.py)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from engines.interface import ModelFileError
from engines.pytorch.gguf_file import read_layout


@pytest.fixture
def small(tmp_path: Path) -> Path:
    import gguf

    path = tmp_path / "small.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.attention.key_length", 16)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    writer.add_tensor("token_embd.weight", np.arange(3 * 64, dtype=np.float32).reshape(3, 64))
    writer.add_tensor("blk.0.ffn_up.weight", np.ones((8, 64), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_table_as_gguf_py_reads_it(small: Path) -> None:
    import gguf

    layout = read_layout(small)
    assert layout.architecture == "llama" and layout.field("attention.key_length") == 16
    assert layout.array_lengths == {"tokenizer.ggml.tokens": 3}
    for tensor in gguf.GGUFReader(str(small)).tensors:
        info = layout.tensors[tensor.name]
        assert info.offset == tensor.data_offset and info.nbytes == tensor.n_bytes
        assert info.shape == tuple(int(d) for d in reversed(tensor.shape))
        assert info.type_name == tensor.tensor_type.name
    assert np.array_equal(layout.read_f32("token_embd.weight"), np.arange(3 * 64, dtype=np.float32).reshape(3, 64))


def test_a_tensor_past_the_end(small: Path) -> None:
    data = small.read_bytes()
    small.write_bytes(data[:-10])
    with pytest.raises(ModelFileError, match=r"small\.gguf: tensor blk\.0\.ffn_up\.weight's 1024 bytes .* truncated"):
        read_layout(small)


def test_an_unknown_type(small: Path) -> None:
    data = bytearray(small.read_bytes())
    name = b"blk.0.ffn_up.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4 + 2 * 8  # n_dims, two dims, type
    data[at : at + 4] = struct.pack("<I", 99)
    small.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=r"tensor blk\.0\.ffn_up\.weight has the GGML type id 99"):
        read_layout(small)


def _one_key_file(path: Path, value: bytes) -> Path:
    """A GGUF file of no tensors and one metadata key `k` whose type and value are `value`'s bytes."""
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"k" + value)
    return path


def test_arrays_nested_deeply_are_refused(tmp_path: Path) -> None:
    """An array of arrays 5000 deep is 60 KB: refused, not walked until Python's recursion limit."""
    nested = struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 5000 + struct.pack("<IQ", 4, 0)
    with pytest.raises(ModelFileError, match="nested more than"):
        read_layout(_one_key_file(tmp_path / "nested.gguf", nested))


def test_arrays_nested_a_little_are_read(tmp_path: Path) -> None:
    nested = struct.pack("<I", 9) + struct.pack("<IQ", 9, 2) + struct.pack("<IQI", 4, 1, 7) * 2
    assert read_layout(_one_key_file(tmp_path / "nested.gguf", nested)).array_lengths == {"k": 2}
