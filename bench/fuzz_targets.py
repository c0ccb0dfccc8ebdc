"""Hostile inputs for the readers of bytes a user or a download hands the server: the fuzz targets, their seeds, the
mutators, and the guard each input runs under.

Targets (each a reader as the server runs it, and the one error type that may come out of it):
- `gguf-layout`: `gguf_file.read_layout` and gguf-py's reader after it, every tensor's bytes read and the block
  types the kernels take decoded and checked as the loader checks them (`gguf_weights._checked_blocks`);
  `ModelFileError`;
- `gguf-loader`: the native engine built from the file (`PyTorchEngine`: config and tokenizer from the metadata,
  the model built from the config, shapes against the config, weights read and packed, the KV pool);
  `ModelFileError` or `UnsupportedModelError`;
- `config-pbtxt`, `config-yaml`: `model_config.parse_model_config` of a model folder's config file; `ConfigError`;
- `kserve-body`: `kserve.codec.parse_infer_request` of a v2 infer body with the binary tensor extension (the
  input's first 4 bytes are its `Inference-Header-Content-Length`, 0xFFFFFFFF for none); `TensorCodecError`.

Each input is a seed mutated a few times (bits flipped, integer fields of the format set to edge values, cut short,
chunks deleted, repeated or overwritten, tokens of the format inserted) and runs under `attempt`: a CPU-time limit
(SIGPROF, with a wall-clock backstop), and tracemalloc's peak against what the input's length justifies. Its outcome
is `accepted`, `refused` (the target's error, naming the file where it is a file's), or a defect: `crash` (any other
exception), `hang`, `overallocation`. A C fault kills the process: the runner (bench/fuzz_gguf.py) saves each input
before running it.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import signal
import struct
import time
import traceback
import tracemalloc
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFECTS = ("crash", "hang", "overallocation")
WALL_FACTOR = 6  # an input's wall-clock limit, in CPU time limits
MiB = 1 << 20


class Hang(BaseException):
    """An input ran past its target's time limit (BaseException: no `except Exception` in a target swallows it)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class InvariantError(AssertionError):
    """A target accepted an input but what it returned breaks a promise (a tensor past the end of the file)."""


@dataclass(frozen=True)
class Target:
    """A reader under test: `run(data, work)` feeds it one input (`work`: a scratch folder of its own); `expected`:
    the errors that are a clear refusal; `time_limit` seconds of CPU time per input; `base_bytes` + `per_byte` x the
    input's length: the most Python and numpy memory (tracemalloc's peak) one input may take."""

    name: str
    seeds: Callable[[Path], list[bytes]]
    run: Callable[[bytes, Path], None]
    expected: tuple[type[BaseException], ...]
    mutate: Callable[[bytes, random.Random], bytes]
    time_limit: float = 5.0
    base_bytes: int = 8 * MiB
    per_byte: int = 64
    names_file: bool = False  # its refusals must name the input's file


@dataclass
class Outcome:
    kind: str  # accepted, refused, crash, hang, overallocation
    detail: str = ""
    seconds: float = 0.0
    peak: int = 0


def attempt(target: Target, data: bytes, work: Path) -> Outcome:
    """Run one input under the guards (main thread only: signals). The time limit is CPU time (SIGPROF), so a busy
    machine slowing a parse down is not taken for a hang; a wall-clock limit of `WALL_FACTOR` times it catches an
    input that blocks without using the CPU."""
    previous = {sig: signal.signal(sig, _raise_hang) for sig in (signal.SIGPROF, signal.SIGALRM)}
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    started = time.perf_counter()
    signal.setitimer(signal.ITIMER_PROF, target.time_limit)
    signal.setitimer(signal.ITIMER_REAL, target.time_limit * WALL_FACTOR)
    try:
        target.run(data, work)
        outcome = Outcome("accepted")
    except Hang as hang:
        outcome = Outcome("hang", f"still running after {hang.what}")
    except target.expected as exc:
        message = str(exc)
        if target.names_file and "fuzz-" not in message:
            outcome = Outcome("crash", f"a refusal that does not name the file: {message[:300]}")
        else:
            outcome = Outcome("refused", message[:300])
    except Exception:  # noqa: BLE001 - any other exception is the defect being looked for
        outcome = Outcome("crash", traceback.format_exc(limit=-6)[-3000:])
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    outcome.seconds = time.perf_counter() - started
    outcome.peak = tracemalloc.get_traced_memory()[1]
    if not tracing:
        tracemalloc.stop()
    allowed = target.base_bytes + target.per_byte * len(data)
    if outcome.kind in ("accepted", "refused") and outcome.peak > allowed:
        outcome = Outcome(
            "overallocation",
            f"peak {outcome.peak} bytes for a {len(data)}-byte input "
            f"(allowed {allowed}); {outcome.kind}: {outcome.detail}",
            outcome.seconds,
            outcome.peak,
        )
    return outcome


def _raise_hang(signum: int, frame: Any) -> None:
    raise Hang("its CPU time limit" if signum == signal.SIGPROF else "its wall-clock limit")


# ---------------------------------------------------------------- mutators


def interesting(width: int, old: int, size: int) -> list[int]:
    """Edge values for an unsigned little-endian field of `width` bytes in an input of `size` bytes."""
    top = 1 << (8 * width)
    values = [
        0,
        1,
        2,
        3,
        4,
        7,
        8,
        16,
        31,
        32,
        255,
        256,
        4096,
        1 << 31,
        (1 << 32) - 1,
        top // 2 - 1,
        top // 2,
        top - 1,
        size,
        size // 2,
        size + 1,
        size * 8,
        old + 1,
        old - 1,
        old * 2,
        old << 16,
        old ^ 0x80,
    ]
    return [v % top for v in values]


def mutate_bytes(
    data: bytes, rng: random.Random, fields: list[tuple[int, int]], tokens: tuple[bytes, ...] = (), hot: int = 0
) -> bytes:
    """`data` changed 1 to 4 times: integer `fields` ((offset, width)) set to edge values, bits flipped (half of
    them in the first `hot` bytes: a file's header and tables), bytes set, the input cut short, chunks deleted,
    repeated, overwritten, or `tokens` of the format inserted."""
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        if not buf:
            buf = bytearray(rng.randbytes(rng.randrange(1, 64)))
        op = rng.random()
        if fields and op < 0.4:
            at, width = rng.choice(fields)
            if at + width <= len(buf):
                old = int.from_bytes(buf[at : at + width], "little")
                buf[at : at + width] = rng.choice(interesting(width, old, len(buf))).to_bytes(width, "little")
        elif op < 0.55:
            span = hot if hot and rng.random() < 0.5 else len(buf)
            at = rng.randrange(min(span, len(buf)))
            buf[at] ^= 1 << rng.randrange(8)
        elif op < 0.62:
            buf[rng.randrange(len(buf))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, 0x22, 0x5C, 0x0A))
        elif op < 0.7:
            del buf[rng.randrange(len(buf)) :]
        elif op < 0.77:
            at = rng.randrange(len(buf))
            del buf[at : at + rng.choice((1, 2, 4, 8, rng.randrange(1, 256)))]
        elif op < 0.83:
            at = rng.randrange(len(buf))
            chunk = buf[at : at + rng.randrange(1, 64)]
            buf[at:at] = chunk * rng.choice((1, 2, 16))
        elif op < 0.88 or not tokens:
            at = rng.randrange(len(buf))
            buf[at : at + 8] = rng.randbytes(rng.randrange(1, 9))
        else:
            at = rng.randrange(len(buf) + 1)
            buf[at:at] = rng.choice(tokens)
    return bytes(buf)


# ---------------------------------------------------------------- GGUF

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
ARRAY_FIELDS = 8  # a long array's (a vocabulary's) first elements only: the rest are alike


def gguf_fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of the integer fields of a valid GGUF file's header, metadata and tensor table: the version,
    counts, lengths, value and element types, small scalars, dimension counts, dimensions, tensor types and
    offsets (the first elements of each array)."""
    out: list[tuple[int, int]] = []
    pos = 4

    def integer(width: int, record: bool = True) -> int:
        nonlocal pos
        if record:
            out.append((pos, width))
        value = int.from_bytes(data[pos : pos + width], "little")
        pos += width
        return value

    def string(record: bool = True) -> None:
        nonlocal pos
        length = integer(8, record)  # (not `pos += integer(...)`: that adds to the position before the length)
        pos += length

    def value(kind: int, record: bool = True) -> None:
        nonlocal pos
        if kind == 8:
            string(record)
        elif kind == 9:
            sub, count = integer(4, record), integer(8, record)
            for i in range(count):
                value(sub, record and i < ARRAY_FIELDS)
        else:
            if record:
                out.append((pos, _SCALAR_SIZES[kind]))
            pos += _SCALAR_SIZES[kind]

    integer(4)
    n_tensors, n_fields = integer(8), integer(8)
    for _ in range(n_fields):
        string()
        value(integer(4))
    for _ in range(n_tensors):
        string()
        for _ in range(integer(4)):
            integer(8)
        integer(4)
        integer(8)
    return out


def small_gguf(target: Path) -> Path:
    """A small GGUF file of every metadata kind (scalars, strings, arrays of each, an array of arrays) and a 2-D
    tensor of each block type the kernels read, plus a 1-D F32 tensor; written with gguf-py as a converter does."""
    import gguf
    import numpy as np
    from gguf.quants import quantize

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_uint32("llama.block_count", 1)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("general.flag", True)
    writer.add_int64("general.big", -5)
    writer.add_string("general.name", "fuzz seed ✓")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bc", "<s>", "é"])
    writer.add_array("tokenizer.ggml.scores", [0.0, -1.5, 2.0, 3.25])
    writer.add_array("general.nested", [[1, 2], [3]])
    writer.add_tensor("rope_freqs.weight", np.ones(32, dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones((2, 64), dtype=np.float16))
    for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        kind = gguf.GGMLQuantizationType[name]
        weight = (rng.standard_normal((2, 64)) * 0.1).astype(np.float32)
        writer.add_tensor(f"w.{name}", quantize(weight, kind), raw_dtype=kind)
    for name, block_bytes, scale_at in (("Q4_K", 144, 0), ("Q5_K", 176, 0), ("Q6_K", 210, 208)):
        raw = rng.integers(0, 256, size=(2, block_bytes), dtype=np.uint8)
        scales = np.array([1e-3, 2e-3], dtype=np.float16).view(np.uint8)
        raw[:, scale_at : scale_at + (2 if name == "Q6_K" else 4)] = scales[: 2 if name == "Q6_K" else 4]
        writer.add_tensor(f"w.{name}", raw, raw_dtype=gguf.GGMLQuantizationType[name])  # bytes: 256 weights a row
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def tiny_llama_gguf(target: Path) -> Path:
    """A tiny llama (2 layers, 64 wide, 512 tokens of SmolLM2's vocabulary) of random weights in the block types the
    kernels read: what the loader target builds engines of."""
    import sys

    sys.path.insert(0, str(ROOT))
    from bench.gguf_files import shipped_gguf
    from tests.random_gguf_blocks import random_llama_gguf

    return random_llama_gguf(target, shipped_gguf(), vocab=512)


def _cached_seed(cache: Path, name: str, make: Callable[[Path], Path]) -> bytes:
    path = cache / name
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = make(cache / f".{name}.tmp")
        tmp.replace(path)
    return path.read_bytes()


def _input_file(work: Path, data: bytes, suffix: str) -> Path:
    """A fresh file for each input (a file gguf-py still maps must not be rewritten under it)."""
    for old in work.glob(f"fuzz-*{suffix}"):
        old.unlink()
    path = work / f"fuzz-{time.monotonic_ns()}{suffix}"
    path.write_bytes(data)
    return path


def _gguf_mutator(data: bytes, rng: random.Random) -> bytes:
    fields = _fields_of(data)
    return mutate_bytes(data, rng, fields, hot=fields[-1][0] + 8 if fields else 0)


_FIELDS: dict[int, list[tuple[int, int]]] = {}


def _fields_of(seed: bytes) -> list[tuple[int, int]]:
    key = hash(seed)
    if key not in _FIELDS:
        _FIELDS[key] = gguf_fields(seed)
    return _FIELDS[key]


def run_gguf_layout(data: bytes, work: Path) -> None:
    import numpy as np

    from engines.pytorch.gguf_file import open_reader, read_layout
    from engines.pytorch.gguf_weights import _checked_blocks

    path = _input_file(work, data, ".gguf")
    layout = read_layout(path)
    for info in layout.tensors.values():
        if info.offset < 0 or info.offset + info.nbytes > len(data):
            raise InvariantError(f"tensor {info.name} accepted at {info.offset}+{info.nbytes} of {len(data)} bytes")
    reader = open_reader(path)
    for tensor in reader.tensors:
        raw = np.asarray(tensor.data)
        if raw.nbytes != layout.tensors[tensor.name].nbytes:
            raise InvariantError(f"gguf-py reads {raw.nbytes} bytes of {tensor.name}, the layout {tensor.n_bytes}")
        _checked_blocks(tensor)
    del reader


def run_gguf_loader(data: bytes, work: Path) -> None:
    from engines.pytorch.engine import PyTorchEngine
    from engines.pytorch.loader import default_cache_dir

    path = _input_file(work, data, ".gguf")
    # the server's cache: its C kernels are built once (the folders made of each input are removed below)
    cache = Path(os.environ.get("SWITCHYARD_CACHE_DIR") or default_cache_dir())
    try:
        PyTorchEngine(path, cache_dir=cache, kv_cache_tokens=64, gemm_threads=1)
    finally:
        for made in (cache / "gguf").glob("fuzz-*"):
            shutil.rmtree(made, ignore_errors=True) if made.is_dir() else made.unlink()


# ---------------------------------------------------------------- model configs

PBTXT_TOKENS = (
    b"{",
    b"}",
    b"[",
    b"]",
    b"<",
    b">",
    b":",
    b",",
    b";",
    b'"',
    b"'",
    b"\\",
    b"#",
    b"-",
    b"0x",
    b"9" * 5000,
    b"1e999",
    b"-inf",
    b"nan",
    b"\\u",
    b"\\U0010ffff",
    b"\\777",
    b"{" * 80,
    b"[" * 80,
    b'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]',
    b"max_batch_size: 99999999999999999999",
    b'parameters { key: "k" value: { string_value: "v" } }',
    b"dims: [ 0x7fffffffffffffff ]",
    b"instance_group [ { count: 1000000 kind: KIND_CPU } ]",
    b"\xff\xfe",
    b"\x00",
)
YAML_TOKENS = (
    b"{",
    b"}",
    b"[",
    b"]",
    b": ",
    b"- ",
    b"\n",
    b"\n  ",
    b"&a ",
    b"*a",
    b"<<: *a\n",
    b"!!binary ",
    b"!!python/object:os.system ",
    b"9" * 5000,
    b"0x" + b"f" * 40,
    b".inf",
    b"~",
    b"'",
    b'"',
    b"\t",
    b"[" * 2000,
    b"{a: " * 500,
    b"max_model_len: 99999999999999999999999\n",
    b"\xff",
    b"\x00",
    b"a: &a [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n",
    b"scheduler: {max_num_seqs: -1}\n",
    b"kv_cache:\n  max_tokens: 1e400\n",
    b"model: {source: ../../../etc/passwd}\n",
)


def _config_seeds(name: str) -> Callable[[Path], list[bytes]]:
    def seeds(cache: Path) -> list[bytes]:
        found = sorted((ROOT / "model_repository").glob(f"*/{name}")) + sorted(
            (ROOT / "tests" / "kserve_repository").glob(f"*/{name}")
        )
        # without their `name:` (it must equal the folder's, which is the target's own)
        return [re.sub(rb"(?m)^name: .*$", b"", p.read_bytes()) for p in found] or [b""]

    return seeds


def _config_runner(name: str) -> Callable[[bytes, Path], None]:
    def run(data: bytes, work: Path) -> None:
        from gateway.repository.model_config import parse_model_config

        folder = work / "model"
        folder.mkdir(exist_ok=True)
        (folder / name).write_bytes(data)
        parse_model_config(folder / name, "model")

    return run


# ---------------------------------------------------------------- KServe binary tensors

NO_HEADER = 0xFFFFFFFF


def kserve_input(doc: dict[str, Any], blobs: list[bytes], header: int | None = -1) -> bytes:
    """A fuzz input of the kserve-body target: the header length (the JSON's own unless given; None: absent), the
    JSON and the blobs."""
    import json

    head = json.dumps(doc).encode()
    length = len(head) if header == -1 else (NO_HEADER if header is None else header)
    return struct.pack("<I", length) + head + b"".join(blobs)


def _kserve_seeds(cache: Path) -> list[bytes]:
    import numpy as np

    from gateway.tensor.tensors import encode_binary_tensor

    floats = encode_binary_tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    words = encode_binary_tensor(np.array([b"hello", b"", b"\xff\x00"], dtype=object), "BYTES")
    bf16 = encode_binary_tensor(np.array([1.5, -2.0], dtype=np.float32), "BF16")
    return [
        kserve_input(
            {
                "id": "a",
                "inputs": [
                    {"name": "X", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": len(floats)}},
                    {"name": "T", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": len(words)}},
                    {"name": "B", "datatype": "BF16", "shape": [2], "parameters": {"binary_data_size": len(bf16)}},
                    {"name": "J", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3, -4]]},
                ],
                "outputs": [{"name": "Y", "parameters": {"binary_data": True}}],
                "parameters": {"binary_data_output": False},
            },
            [floats, words, bf16],
        ),
        kserve_input(
            {
                "inputs": [
                    {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["0.3, 0.4"]},
                    {"name": "F", "datatype": "BOOL", "shape": [2], "data": [True, False]},
                    {"name": "H", "datatype": "FP16", "shape": [1], "data": [65504.0]},
                    {"name": "U", "datatype": "UINT8", "shape": [0], "data": []},
                ]
            },
            [],
            None,
        ),
    ]


KSERVE_TOKENS = (
    b'"binary_data_size": 99999999999',
    b'"shape": [4294967296, 4294967296]',
    b'"shape": [-1]',
    b'"datatype": "BYTES"',
    b'"datatype": "BF16"',
    b'"datatype": "FP64"',
    b"[" * 100,
    b"1e400",
    b"\\ud800",
    b"\xff\xff\xff\xff",
    b"\x00\x00\x00\x00",
    b'"data": [[[[1]]]]',
    b"null",
    b"NaN",
)


def _kserve_mutator(data: bytes, rng: random.Random) -> bytes:
    """Mutations of the JSON and the blobs, with the header length field and the blobs' BYTES prefixes as fields."""
    fields = [(0, 4)] + [(at, 4) for at in range(4, len(data) - 3, 4)][:64]
    return mutate_bytes(data, rng, fields, KSERVE_TOKENS)


def run_kserve_body(data: bytes, work: Path) -> None:
    import math

    from gateway.kserve.codec import parse_infer_request

    if len(data) < 4:  # a body of a few bytes, no header
        parse_infer_request(data, None)
        return
    length = struct.unpack("<I", data[:4])[0]
    request = parse_infer_request(data[4:], None if length == NO_HEADER else str(length))
    for tensor in request.inputs:
        if tensor.array.size != math.prod(tensor.array.shape):
            raise InvariantError(f"input {tensor.name}: {tensor.array.size} values for shape {tensor.array.shape}")


# ---------------------------------------------------------------- the targets


def targets() -> dict[str, Target]:
    from engines.interface import ModelFileError, UnsupportedModelError
    from gateway.errors import ConfigError
    from gateway.tensor.tensors import TensorCodecError

    def gguf_seeds(cache: Path) -> list[bytes]:
        return [_cached_seed(cache, "small.gguf", small_gguf), _cached_seed(cache, "tiny-llama.gguf", tiny_llama_gguf)]

    def loader_seeds(cache: Path) -> list[bytes]:
        return [_cached_seed(cache, "tiny-llama.gguf", tiny_llama_gguf)]

    found = [
        Target("gguf-layout", gguf_seeds, run_gguf_layout, (ModelFileError,), _gguf_mutator, names_file=True),
        Target(
            "gguf-loader",
            loader_seeds,
            run_gguf_loader,
            (ModelFileError, UnsupportedModelError),
            _gguf_mutator,
            time_limit=60.0,
            base_bytes=256 * MiB,
        ),
        Target(
            "config-pbtxt",
            _config_seeds("config.pbtxt"),
            _config_runner("config.pbtxt"),
            (ConfigError,),
            lambda data, rng: mutate_bytes(data, rng, [], PBTXT_TOKENS),
        ),
        Target(
            "config-yaml",
            _config_seeds("config.yaml"),
            _config_runner("config.yaml"),
            (ConfigError,),
            lambda data, rng: mutate_bytes(data, rng, [], YAML_TOKENS),
        ),
        Target("kserve-body", _kserve_seeds, run_kserve_body, (TensorCodecError,), _kserve_mutator),
    ]
    return {t.name: t for t in found}


@dataclass
class Report:
    """What one target's run found: inputs by outcome, the defects (kind, detail, the input's file), the slowest
    input and the largest peak."""

    target: str
    inputs: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    defects: list[dict[str, str]] = field(default_factory=list)
    slowest: float = 0.0
    peak: int = 0

    def add(self, outcome: Outcome) -> None:
        self.inputs += 1
        self.outcomes[outcome.kind] = self.outcomes.get(outcome.kind, 0) + 1
        self.slowest = max(self.slowest, outcome.seconds)
        self.peak = max(self.peak, outcome.peak)


def fuzz(
    target: Target,
    work: Path,
    cache: Path,
    *,
    inputs: int | None = None,
    seconds: float | None = None,
    seed: int = 0,
    save: Path | None = None,
    keep_defects: int = 20,
) -> Report:
    """Run `target` over `inputs` mutated seeds (or for `seconds`), once each seed has run unmutated; `save`: a
    folder where each input is written before it runs (`last-<target>.bin`: what a C fault killed the process on)
    and each defect's input is kept."""
    logging.getLogger("switchyard").setLevel(logging.ERROR)
    warnings.simplefilter("ignore", RuntimeWarning)  # gguf-py's dequantization of NaN scales says so per input
    rng = random.Random(seed)
    seeds = target.seeds(cache)
    report = Report(target.name)
    work.mkdir(parents=True, exist_ok=True)
    for data in seeds:  # each seed is valid (and the first builds what later inputs reuse: the C kernels)
        target.run(data, work)
    deadline = time.monotonic() + seconds if seconds is not None else None
    while (inputs is None or report.inputs < inputs) and (deadline is None or time.monotonic() < deadline):
        data = target.mutate(rng.choice(seeds), rng)
        if save is not None:
            save.mkdir(parents=True, exist_ok=True)
            (save / f"last-{target.name}.bin").write_bytes(data)
        outcome = attempt(target, data, work)
        report.add(outcome)
        if outcome.kind in DEFECTS and len(report.defects) < keep_defects:
            kept = ""
            if save is not None:
                kept = str(save / f"{target.name}-{report.inputs}.bin")
                Path(kept).write_bytes(data)
            report.defects.append({"kind": outcome.kind, "detail": outcome.detail, "input": kept})
    return report
