"""GGUF files made from an HF folder by llama.cpp's own tools, for tests and benchmarks: what users download.

`convert_hf_to_gguf.py` (with its `conversion/` package and `gguf-py`, from the pinned llama-cpp-python sdist that
bench/llamacpp_env.py fetches) writes the F32, F16 or BF16 file; every other type (Q8_0, Q4_K_M, Q6_K, ...) is that
F32 file quantized by llama.cpp's `llama_model_quantize` in the llama.cpp environment. The converter runs under this
Python (it needs torch, transformers and numpy) with the sdist's gguf-py first on its path, so the file is the one
llama.cpp's release writes, whatever gguf version transformers installed here.

Files are cached under `<cache>/gguf-converted/<folder name>-<key>/`, the key a hash of every file of the folder
(names and bytes) and of the maker's version, so a folder made again with the same seed finds its files at once.

    python bench/gguf_convert.py FOLDER [TYPE ...]    # make (or find) the files; prints their paths and sizes
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

CONVERTER_TYPES = ("F32", "F16", "BF16")  # written by convert_hf_to_gguf.py itself (its --outtype)
MAKER_VERSION = 1  # bump when the way a file is made changes, so that files made the old way are not used


def folder_key(folder: Path) -> str:
    """A hash of every file under `folder` (relative names and contents) and of MAKER_VERSION."""
    digest = hashlib.sha256(f"{MAKER_VERSION}".encode())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def converted(folder: Path, kind: str = "F32", cache_dir: Path | None = None) -> Path:
    """The GGUF file of the HF folder `folder` in type `kind` (F32, F16, BF16, or any llama.cpp quantization:
    Q8_0, Q4_K_M, ...), made on first use. Raises bench.llamacpp_env.ConverterUnavailable when the sdist cannot be
    fetched and LlamaCppUnavailable when a quantized type is asked for and llama.cpp is not installed."""
    from bench.llamacpp_env import cache_root, quantize

    folder = folder.resolve()
    target_dir = (cache_dir or cache_root()) / "gguf-converted" / f"{folder.name}-{folder_key(folder)}"
    target = target_dir / f"{folder.name}.{kind}.gguf"
    if target.is_file():
        return target
    if kind in CONVERTER_TYPES:
        convert_folder(folder, target, kind, cache_dir)
        return target
    source = converted(folder, "F32", cache_dir)  # quantized from full precision, as llama.cpp's docs do
    return quantize(source, target, kind, threads=min(2, os.cpu_count() or 1))


def _converter(cache_dir: Path | None) -> tuple[Path, dict[str, str]]:
    """The converter's source folder and the environment to run it in: this Python with the sdist's gguf-py and
    the converter's own packages (sentencepiece) first on its path."""
    from bench.llamacpp_env import converter_packages, converter_source

    source = converter_source(cache_dir)
    path = [str(source / "gguf-py"), str(converter_packages(cache_dir))]
    return source, {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    }


def convert_folder(folder: Path, target: Path, kind: str, cache_dir: Path | None = None) -> None:
    """llama.cpp's convert_hf_to_gguf.py of the HF folder `folder` to `target` in type `kind` (F32, F16, BF16),
    written beside it first and renamed when whole."""
    source, env = _converter(cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    run = subprocess.run(
        [
            sys.executable,
            str(source / "convert_hf_to_gguf.py"),
            str(folder),
            "--outfile",
            str(partial),
            "--outtype",
            kind.lower(),
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    if run.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(
            f"llama.cpp's convert_hf_to_gguf.py could not convert {folder.name} (exit "
            f"{run.returncode}):\n{run.stderr[-3000:]}"
        )
    partial.replace(target)


def convert_lora(adapter: Path, base: Path, target: Path, cache_dir: Path | None = None) -> Path:
    """A PEFT LoRA adapter folder as a GGUF LoRA file (F32), written by llama.cpp's `convert_lora_to_gguf.py` against
    the HF folder `base` (only its config is read). Raises bench.llamacpp_env.ConverterUnavailable without the sdist."""
    source, env = _converter(cache_dir)
    run = subprocess.run(
        [
            sys.executable,
            str(source / "convert_lora_to_gguf.py"),
            str(adapter),
            "--base",
            str(base),
            "--outfile",
            str(target),
            "--outtype",
            "f32",
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    if run.returncode != 0:
        raise RuntimeError(
            f"llama.cpp's convert_lora_to_gguf.py could not convert {adapter.name} (exit "
            f"{run.returncode}):\n{run.stderr[-3000:]}"
        )
    return target


def main(argv: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if not argv:
        sys.exit(__doc__)
    folder = Path(argv[0])
    for kind in argv[1:] or ["F32"]:
        path = converted(folder, kind)
        print(f"{kind:7s} {path.stat().st_size / 1e6:7.1f} MB  {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
