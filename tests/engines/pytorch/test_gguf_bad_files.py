"""A damaged or unsupported GGUF file, loaded through the native engine's loader, is one clear `ModelFileError` that
names the file, the tensor at fault (where one is) and the fix: never a crash, a hang, or a read past the file.

Each case is a copy of SmolLM2's shipped GGUF file with one thing broken: cut short (in its metadata, in its
tensors), its magic or version flipped, a length or count field made huge, a tensor's type id unknown, a tensor's
dimension or the config's width disagreeing with the tensors, the architecture unknown.
"""

from __future__ import annotations

import shutil
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.gguf_files import shipped_gguf
from engines.interface import ModelFileError
from engines.pytorch.engine import PyTorchEngine
from engines.pytorch.gguf_file import read_layout
from engines.pytorch.loader import load_gguf_blocks, resolve_hf_folder

SOURCE = shipped_gguf()
TENSOR = "blk.0.ffn_down.weight"
LOAD_SECONDS = 120  # a hang fails the test instead of stopping the suite


def _copy(tmp_path: Path, name: str = "broken.gguf") -> Path:
    target = tmp_path / name
    shutil.copyfile(SOURCE, target)
    return target


def _patch(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)


def _find(path: Path, needle: bytes) -> int:
    """The offset just after the first `needle` (a metadata key or tensor name, with its length in front)."""
    data = path.read_bytes()[: 4 << 20]  # the metadata and the tensor table are in the first few MB
    at = data.find(struct.pack("<Q", len(needle)) + needle)
    assert at >= 0, needle
    return at + 8 + len(needle)


def _tensor_entry(path: Path, name: str) -> int:
    """Where tensor `name`'s entry in the table continues after its name: n_dims (u32), dims (u64 each), type
    (u32), offset (u64)."""
    return _find(path, name.encode())


def _load_error(path: Path, cache_dir: Path, load: Callable[..., object] = load_gguf_blocks) -> str:
    """The ModelFileError message of loading `path`, failing on any other outcome or after LOAD_SECONDS."""
    outcome: list[BaseException | object] = []

    def run() -> None:
        try:
            outcome.append(load(path, cache_dir=cache_dir))
        except BaseException as exc:  # noqa: BLE001 - the test looks at whatever came out
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(LOAD_SECONDS)
    assert not thread.is_alive(), f"loading {path.name} did not finish in {LOAD_SECONDS} s"
    assert isinstance(outcome[0], ModelFileError), f"expected a ModelFileError, got {outcome[0]!r}"
    message = str(outcome[0])
    assert path.name in message and "/" not in message.split(path.name)[0], message  # the file, not its folder
    return message


def test_truncated_in_its_tensors_names_the_first_tensor_cut(tmp_path: Path) -> None:
    layout = read_layout(SOURCE)
    cut = layout.tensors[TENSOR]
    target = tmp_path / "cut.gguf"
    with SOURCE.open("rb") as f:
        target.write_bytes(f.read(cut.offset + cut.nbytes // 2))
    message = _load_error(target, tmp_path)
    assert TENSOR in message and "truncated" in message and "download or convert the file again" in message


@pytest.mark.parametrize("keep", [3, 20, 4096])  # in the header, in the first key, in the vocabulary
def test_truncated_in_its_metadata(tmp_path: Path, keep: int) -> None:
    target = tmp_path / "short.gguf"
    with SOURCE.open("rb") as f:
        target.write_bytes(f.read(keep))
    assert "download or convert the file again" in _load_error(target, tmp_path)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    target = _copy(tmp_path)
    _patch(target, 0, b"GGML")
    assert "does not start with 'GGUF'" in _load_error(target, tmp_path)


def test_an_unknown_version(tmp_path: Path) -> None:
    target = _copy(tmp_path)
    _patch(target, 4, struct.pack("<I", 7))
    assert "GGUF version 7" in _load_error(target, tmp_path)


@pytest.mark.parametrize(
    "field", ["tensor count", "metadata count", "key length", "array length", "string length", "dimension"]
)
def test_a_huge_size_field(tmp_path: Path, field: str) -> None:
    target = _copy(tmp_path)
    huge = struct.pack("<Q", 1 << 62)
    if field == "tensor count":
        _patch(target, 8, huge)
    elif field == "metadata count":
        _patch(target, 16, huge)
    elif field == "key length":
        _patch(target, 24, huge)  # the first key's length
    elif field == "array length":  # the vocabulary: key, type ARRAY (u32), element type (u32), count (u64)
        _patch(target, _find(target, b"tokenizer.ggml.tokens") + 8, huge)
    elif field == "string length":  # the first token's length
        _patch(target, _find(target, b"tokenizer.ggml.tokens") + 16, huge)
    else:
        _patch(target, _tensor_entry(target, TENSOR) + 4, huge)
    message = _load_error(target, tmp_path)
    assert "download or convert the file again" in message
    if field == "dimension":
        assert TENSOR in message


def test_an_unknown_quantization_type(tmp_path: Path) -> None:
    target = _copy(tmp_path)
    entry = _tensor_entry(target, TENSOR)
    _patch(target, entry + 4 + 2 * 8, struct.pack("<I", 250))  # after n_dims and two dims: the type id
    message = _load_error(target, tmp_path)
    assert TENSOR in message and "type id 250" in message and "requantize" in message


def test_a_tensor_whose_shape_disagrees_with_the_config(tmp_path: Path) -> None:
    """The file says 1024 for the MLP's width; its tensors are 1536 wide."""
    target = _copy(tmp_path)
    at = _find(target, b"llama.feed_forward_length")
    assert struct.unpack("<I", target.read_bytes()[at : at + 4])[0] == 4  # UINT32
    _patch(target, at + 4, struct.pack("<I", 1024))
    message = _load_error(target, tmp_path)
    assert "blk.0.ffn_" in message and "1536" in message and "1024" in message and "disagree" in message


def test_a_tensor_with_the_wrong_dimension(tmp_path: Path) -> None:
    """One tensor's own entry disagrees with the config (and its bytes with the table): named, not read."""
    target = _copy(tmp_path)
    entry = _tensor_entry(target, TENSOR)
    _patch(target, entry + 4 + 8, struct.pack("<Q", 288))  # its second dimension: 576 -> 288
    message = _load_error(target, tmp_path)
    assert TENSOR in message


def test_an_unsupported_architecture(tmp_path: Path) -> None:
    target = _copy(tmp_path)
    at = _find(target, b"general.architecture")
    _patch(target, at + 4 + 8, b"zzzzz")  # after the type (u32) and the string's length (u64): "llama"
    message = _load_error(target, tmp_path)
    assert "architecture 'zzzzz'" in message and "backend: vllm" in message and "qwen3" in message


def test_the_float32_conversion_path_says_the_same(tmp_path: Path) -> None:
    """`resolve_hf_folder` (bfloat16, fast_kernels off, vLLM) checks the file as well."""
    target = _copy(tmp_path)
    _patch(target, _tensor_entry(target, TENSOR) + 4 + 2 * 8, struct.pack("<I", 250))
    assert "type id 250" in _load_error(
        target, tmp_path, lambda path, cache_dir: resolve_hf_folder(path, cache_dir=cache_dir)
    )


def test_the_engine_raises_it(tmp_path: Path) -> None:
    target = _copy(tmp_path)
    _patch(target, 0, b"GGML")
    with pytest.raises(ModelFileError, match=r"broken\.gguf"):
        PyTorchEngine(target, cache_dir=tmp_path)
