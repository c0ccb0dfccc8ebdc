"""A GGUF file's layout (header, metadata, tensor table) read and checked against the file before anything else
reads it.

Why: gguf-py's reader (which transformers and our loader read GGUF with) trusts the file. A truncated download makes
it fail deep inside numpy, a corrupt length field makes it loop for hours over an array that is not there, and an
unknown type id stops it with a bare enum error; nothing it says names the file or the fix. Here every count,
length, offset and size is checked against the file's length first (the metadata walked with `struct` over a
read-only mapping), so a bad file is one `ModelFileError` that says which file, which tensor, and what to do, and no
tensor's bytes are read (by gguf-py, numpy or our kernels) past the end of the file.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engines.interface import ModelFileError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # what gguf-py reads (version 1 had 32-bit counts; no tool writes it since 2023)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
# arrays of arrays: gguf-py writes them (llama.cpp's reader refuses any); deeper ones are refused before their walk
# could reach Python's recursion limit (12 bytes a level)
MAX_ARRAY_NESTING = 8
# metadata value types: struct format of the scalars; 8 is a string, 9 an array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
REFETCH = "download or convert the file again (llama.cpp's convert_hf_to_gguf.py and llama-quantize write valid ones)"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the table: its shape as transformers lists it (slowest dimension first), its GGML type name,
    and where its bytes are in the file (`offset` from the file's start)."""

    name: str
    shape: tuple[int, ...]
    type_name: str
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GGUFLayout:
    """What `read_layout` found: the metadata's scalars and strings by key (arrays by their length only) and the
    tensor table by name."""

    path: Path
    version: int
    fields: dict[str, Any]
    array_lengths: dict[str, int]
    tensors: dict[str, TensorInfo]

    @property
    def architecture(self) -> str:
        return str(self.fields.get("general.architecture", ""))

    def field(self, key: str, default: Any = None) -> Any:
        """The architecture's key `key` ("attention.key_length" reads "<arch>.attention.key_length")."""
        return self.fields.get(f"{self.architecture}.{key}", default)

    def read_f32(self, name: str) -> np.ndarray:
        """A float32 tensor's values (a small one: rope_freqs), read from the file."""
        info = self.tensors[name]
        if info.type_name != "F32":
            raise ModelFileError(
                f"{self.path.name}: tensor {name} is {info.type_name}, where llama.cpp writes F32; {REFETCH}"
            )
        with self.path.open("rb") as f:
            f.seek(info.offset)
            return np.frombuffer(f.read(info.nbytes), dtype="<f4").reshape(info.shape).astype(np.float32)


class _Cursor:
    """Reads little-endian values from the mapping, never past its end."""

    def __init__(self, data: mmap.mmap | bytes, path: Path) -> None:
        self.data, self.pos, self.path = data, 0, path

    def fail(self, what: str) -> ModelFileError:
        return ModelFileError(
            f"{self.path.name} is not a valid GGUF file: {what} (at byte {self.pos} of {len(self.data)}); {REFETCH}"
        )

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail(f"{what} needs {n} bytes, past the end of the file (truncated or corrupt)")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        raw = self.take(self.unpack("<Q", f"{what}'s length"), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def skip(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail(f"{what} needs {n} bytes, past the end of the file (truncated or corrupt)")
        self.pos += n


def _value(cur: _Cursor, kind: int, key: str) -> Any:
    if kind in SCALARS:
        return cur.unpack(SCALARS[kind], f"the value of {key}")
    if kind == STRING:
        return cur.string(f"the value of {key}")
    raise cur.fail(f"metadata key {key} has the unknown value type {kind}")


def _array(cur: _Cursor, key: str, depth: int = 1) -> int:
    """Skip an array's elements (checking each string's length); returns its length."""
    if depth > MAX_ARRAY_NESTING:
        raise cur.fail(f"{key} holds arrays nested more than {MAX_ARRAY_NESTING} deep")
    kind = cur.unpack("<I", f"{key}'s element type")
    count = cur.unpack("<Q", f"{key}'s length")
    if kind in SCALARS:
        cur.skip(count * struct.calcsize(SCALARS[kind]), f"the {count} values of {key}")
    elif kind == STRING:
        if count * 8 > len(cur.data) - cur.pos:  # every string has at least its 8-byte length
            raise cur.fail(f"{key} claims {count} strings, more than the file holds")
        for _ in range(count):
            cur.skip(cur.unpack("<Q", f"a string's length in {key}"), f"a string of {key}")
    elif kind == ARRAY:
        if count * 12 > len(cur.data) - cur.pos:
            raise cur.fail(f"{key} claims {count} arrays, more than the file holds")
        for _ in range(count):
            _array(cur, key, depth + 1)
    else:
        raise cur.fail(f"array {key} has the unknown element type {kind}")
    return count


def read_layout(path: Path) -> GGUFLayout:
    """The file's layout, every length and offset checked against the file; raises ModelFileError naming the file
    (and the tensor, where one is at fault) and the fix."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    size = path.stat().st_size
    if size < 24:
        raise ModelFileError(
            f"{path.name} is not a valid GGUF file: {size} bytes, shorter than a GGUF header; {REFETCH}"
        )
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cur = _Cursor(data, path)
        if cur.take(4, "the magic") != MAGIC:
            raise ModelFileError(
                f"{path.name} is not a GGUF file (it does not start with 'GGUF'); point "
                "model.gguf_file at a .gguf file, or model.source at an HF folder"
            )
        version = cur.unpack("<I", "the version")
        if version not in VERSIONS:
            raise ModelFileError(
                f"{path.name}: GGUF version {version} (byte-swapped: {version >> 24}) is not read "
                f"here (versions {', '.join(map(str, VERSIONS))}, little-endian); {REFETCH}"
            )
        n_tensors = cur.unpack("<Q", "the tensor count")
        n_fields = cur.unpack("<Q", "the metadata count")
        # a key takes at least 8 + 1 + 4 + 1 bytes, a tensor's entry 8 + 1 + 4 + 8 + 4 + 8
        if n_fields * 14 > size or n_tensors * 33 > size:
            raise cur.fail(
                f"the header claims {n_tensors} tensors and {n_fields} metadata keys, more than {size} bytes can hold"
            )
        fields: dict[str, Any] = {}
        arrays: dict[str, int] = {}
        for _ in range(n_fields):
            key = cur.string("a metadata key")
            kind = cur.unpack("<I", f"{key}'s type")
            if kind == ARRAY:
                arrays[key] = _array(cur, key)
            else:
                fields[key] = _value(cur, kind, key)
        entries = []
        for _ in range(n_tensors):
            name = cur.string("a tensor name")
            n_dims = cur.unpack("<I", f"tensor {name}'s dimension count")
            if not 1 <= n_dims <= MAX_DIMS:
                raise cur.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS})")
            dims = [cur.unpack("<Q", f"tensor {name}'s dimensions") for _ in range(n_dims)]
            type_id = cur.unpack("<I", f"tensor {name}'s type")
            offset = cur.unpack("<Q", f"tensor {name}'s offset")
            entries.append((name, dims, type_id, offset))
        alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise cur.fail(f"general.alignment is {alignment!r}, not a power of two")
        start = -(-cur.pos // alignment) * alignment
    tensors = {}
    for name, dims, type_id, offset in entries:
        try:
            qtype = GGMLQuantizationType(type_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise ModelFileError(
                f"{path.name}: tensor {name} has the GGML type id {type_id}, which the installed gguf library does "
                f"not know (a newer llama.cpp type, or a corrupt file); requantize the model to a common type "
                f"(Q4_K_M, Q8_0, F16) with llama-quantize, or upgrade the gguf package"
            ) from None
        count = int(np.prod(dims, dtype=object))
        if any(d == 0 for d in dims) or dims[0] % block:
            raise ModelFileError(
                f"{path.name}: tensor {name} has the shape {dims[::-1]}, whose rows are not whole "
                f"{qtype.name} blocks of {block} values; {REFETCH}"
            )
        nbytes = count // block * type_size
        if offset % alignment or start + offset + nbytes > size:
            raise ModelFileError(
                f"{path.name}: tensor {name}'s {nbytes} bytes at offset {start + offset} lie past the end of the "
                f"file ({size} bytes) or off its {alignment}-byte alignment: the file is truncated or corrupt; "
                f"{REFETCH}"
            )
        tensors[name] = TensorInfo(name, tuple(dims[::-1]), qtype.name, start + offset, nbytes)
    return GGUFLayout(path, version, fields, arrays, tensors)


def open_reader(path: Path) -> Any:
    """gguf-py's reader of `path`, once `read_layout` has checked it (any failure left is a ModelFileError too)."""
    from gguf import GGUFReader

    read_layout(path)
    try:
        return GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, OverflowError, struct.error) as exc:
        raise ModelFileError(f"{path.name}: gguf-py cannot read it ({exc}); {REFETCH}") from None
