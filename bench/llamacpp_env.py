"""Where llama.cpp lives for the benchmark and the tests, how it is built, and its quantizer.

llama.cpp is the peer a CPU user compares us with (bench/llamacpp_bench.py), and its quantizer makes the GGUF test
files of every block type. It comes from PyPI as llama-cpp-python, built from source (PyPI has no binary wheels).
Its `server` extra pins fastapi/uvicorn/starlette versions our environment must not take, so it lives in a virtual
environment of its own and is only ever run as a subprocess of that environment's Python, never imported here.

The Python of that environment is found, in order, from:
  1. $SWITCHYARD_LLAMA_PYTHON (an error when it is set but cannot import llama_cpp: a CI run must not skip);
  2. `.venv-llama/bin/python` in the repository root (`.ci/run` and `--setup` build it there).
Tests that need llama.cpp skip with a message pointing here when neither exists.

llama.cpp's converter (`convert_hf_to_gguf.py`, its `conversion/` package and `gguf-py`) is not in the built
environment: `converter_source` downloads the pinned sdist (`pip download --no-binary :all:`) into the cache folder
and extracts it once; `converter_packages` installs what the converter needs beyond torch, transformers and numpy
(sentencepiece) into a folder of its own for the Python that runs it (bench/gguf_convert.py uses both).

Stdlib only: `.ci/run` runs this file with bare Python before any environment exists:

    python3 bench/llamacpp_env.py --setup [--venv .venv-llama]   # build it (minutes, from source)
    python3 bench/llamacpp_env.py --converter                    # fetch the converter (sdist), print its folder
    python3 bench/llamacpp_env.py                                # print the Python found, or exit 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV_VAR = "SWITCHYARD_LLAMA_PYTHON"
DEFAULT_VENV = ROOT / ".venv-llama"
# Pinned, so that the benchmark's peer and the test files do not change under us; the server extra brings
# llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`).
REQUIREMENT = "llama-cpp-python[server]==0.3.36"
SDIST = "llama-cpp-python==0.3.36"  # the same release's source: llama.cpp's converter and gguf-py are in it
# what convert_hf_to_gguf.py imports beyond torch, transformers and numpy (the sdist's
# requirements/requirements-convert_legacy_llama.txt; gguf-py comes from the sdist itself)
CONVERTER_PACKAGES = ("sentencepiece>=0.1.98,<0.3.0",)
# llama.cpp's CMake builds its CPU kernels for the building machine (-march=native). Its AMX path (Xeons since
# Sapphire Rapids) crashed on our Xeons, so on a CPU with AMX the build keeps every other instruction set of the
# machine (AVX-512, VNNI, BF16) but not the tile unit: explicit -mno-amx-* flags (all three: GCC 12 keeps amx-int8
# and amx-bf16 on after -mno-amx-tile alone) override what -march=native turns on, whatever their order. They go
# in CFLAGS/CXXFLAGS, which CMake starts its C and C++ flags from.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# The multimodal library (mtmd, imported only by the vision chat handlers) is not built: 51 of the 178 objects.
CMAKE_ARGS = "-DLLAVA_BUILD=OFF"
MISSING = (f"llama-cpp-python not found: set {ENV_VAR} to the Python of an environment with {REQUIREMENT!r}, or "
           "build one with `python3 bench/llamacpp_env.py --setup` (docs/testing.md)")


class LlamaCppUnavailable(RuntimeError):
    """$SWITCHYARD_LLAMA_PYTHON names a Python that cannot run llama.cpp (a setup error, not a reason to skip)."""


class ConverterUnavailable(RuntimeError):
    """llama.cpp's converter could not be fetched (no package index reachable): tests that need it skip on it."""


def cache_root() -> Path:
    """The project's cache folder (as engines/pytorch/loader.py's default_cache_dir, without importing torch)."""
    env = os.environ.get("SWITCHYARD_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "switchyard"


def _pip(python: str, *args: str) -> None:
    run = subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *args], check=False,
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise ConverterUnavailable(f"pip {args[0]} failed (exit {run.returncode}); llama.cpp's converter comes "
                                   f"from PyPI's {SDIST} sdist, so a package index must be reachable once:\n"
                                   f"{run.stderr[-2000:]}")


def converter_source(cache_dir: Path | None = None, python: str = sys.executable) -> Path:
    """The llama.cpp source folder of the pinned sdist (`convert_hf_to_gguf.py`, `conversion/`, `gguf-py/`),
    downloaded and extracted on first use into `cache_dir` (default: cache_root()) / llama-cpp-sdist."""
    root = (cache_dir or cache_root()) / "llama-cpp-sdist"
    project, version = SDIST.split("==")
    name = f"{project.replace('-', '_')}-{version}"  # the sdist's top folder: llama_cpp_python-0.3.36
    target = root / name / "vendor" / "llama.cpp"
    if (target / "convert_hf_to_gguf.py").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=root) as tmp:
        _pip(python, "download", "--no-binary", ":all:", "--no-deps", "-q", "-d", tmp, SDIST)
        archives = sorted(Path(tmp).glob("*.tar.gz"))
        if not archives:
            raise ConverterUnavailable(f"pip download {SDIST} left no .tar.gz in {tmp}")
        with tarfile.open(archives[0]) as archive:
            archive.extractall(tmp, filter="data")
        try:
            (Path(tmp) / name).rename(root / name)  # atomic: a concurrent fetch's copy is as good as ours
        except OSError:
            if not (target / "convert_hf_to_gguf.py").is_file():
                raise
    return target


def converter_packages(cache_dir: Path | None = None, python: str = sys.executable) -> Path:
    """A folder with CONVERTER_PACKAGES installed for `python` (put it on PYTHONPATH when running the converter
    with it), made on first use."""
    ident = f"{Path(python).absolute()}|{'|'.join(CONVERTER_PACKAGES)}"
    root = (cache_dir or cache_root()) / "llama-cpp-sdist"
    target = root / f"converter-packages-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"
    if (target / ".complete").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".packages-", dir=root))
    try:
        _pip(python, "install", "-q", "--no-deps", "--target", str(tmp), *CONVERTER_PACKAGES)
        (tmp / ".complete").touch()
        try:
            tmp.rename(target)
        except OSError:
            if not (target / ".complete").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@cache
def llama_cpp_version(python: str) -> str | None:
    """llama_cpp's version under `python`, or None when it cannot import it."""
    try:
        run = subprocess.run([python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                             check=False, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout.strip() if run.returncode == 0 else None


def find_llama_python() -> Path | None:
    """The Python that runs llama.cpp (see the module's docstring for the order), or None when there is none."""
    named = os.environ.get(ENV_VAR)
    if named:
        if llama_cpp_version(named) is None:
            raise LlamaCppUnavailable(f"{ENV_VAR}={named} cannot import llama_cpp; point it at the Python of an "
                                      f"environment with {REQUIREMENT!r} or unset it")
        return Path(named)
    default = DEFAULT_VENV / "bin" / "python"
    if default.exists() and llama_cpp_version(str(default)) is not None:
        return default
    return None


def _cpu_has_amx() -> bool:
    try:
        return " amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def setup(venv: Path = DEFAULT_VENV, python: str = sys.executable) -> Path:
    """Build the llama.cpp environment at `venv` unless it already runs llama_cpp; returns its Python. Compiling
    llama.cpp takes minutes; pip's wheel cache is bypassed so the build is for this machine's CPU."""
    target = venv / "bin" / "python"
    if target.exists() and llama_cpp_version(str(target)) is not None:
        return target
    start = time.monotonic()
    subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True)
    # a CMAKE_ARGS of the caller's replaces ours; every CPU compiles (whatever generator CMake picks)
    env = {"CMAKE_ARGS": CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1), **os.environ}
    if _cpu_has_amx():
        for name in ("CFLAGS", "CXXFLAGS"):
            env[name] = f"{env.get(name, '')} {NO_AMX_FLAGS}".strip()
    subprocess.run([str(target), "-m", "pip", "install", "-q", "--no-cache-dir", REQUIREMENT], check=True, env=env)
    llama_cpp_version.cache_clear()
    if llama_cpp_version(str(target)) is None:
        raise LlamaCppUnavailable(f"{target} was built but cannot import llama_cpp")
    print(f"built {REQUIREMENT} in {venv} in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return target


# Runs under the llama.cpp Python: argv = source, destination, type name (e.g. Q4_K_M, as llama.cpp's
# LLAMA_FTYPE_MOSTLY_<name>), threads. Requantizing (a Q4_1 file into Q4_K_M) is allowed: it is how the test files
# are made from the shipped SmolLM2; tensors llama.cpp cannot quantize to the type fall back as llama.cpp decides.
_QUANTIZE = """
import ctypes, sys
import llama_cpp
src, dst, name, threads = sys.argv[1:5]
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + name)
params.nthread = int(threads)
params.allow_requantize = True
rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
sys.exit(rc)
"""


def quantize(source: Path, destination: Path, type_name: str, llama_python: Path | None = None,
             threads: int = 2) -> Path:
    """`destination`, made from `source` by llama.cpp's quantizer as `type_name` (Q4_0, Q4_K_M, Q6_K, Q8_0, F16...),
    unless it exists already. Raises LlamaCppUnavailable when there is no llama.cpp (see find_llama_python)."""
    if destination.exists():
        return destination
    python = llama_python or find_llama_python()
    if python is None:
        raise LlamaCppUnavailable(MISSING)
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".partial")
    run = subprocess.run([str(python), "-c", _QUANTIZE, str(source), str(partial), type_name, str(threads)],
                         check=False, capture_output=True, text=True)
    if run.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not quantize {source.name} to {type_name} (exit {run.returncode}):\n"
                           f"{run.stderr[-3000:]}")
    partial.replace(destination)
    return destination


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="store_true", help="build the environment unless it runs llama_cpp already")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="where --setup builds (default: %(default)s)")
    parser.add_argument("--converter", action="store_true", help="fetch llama.cpp's converter (the sdist) and print "
                        "its folder")
    args = parser.parse_args()
    if args.converter:
        print(json.dumps({"converter": str(converter_source()), "packages": str(converter_packages())}))
        return
    if args.setup:
        python = setup(args.venv.resolve())
    else:
        found = find_llama_python()
        if found is None:
            sys.exit(MISSING)
        python = found
    print(json.dumps({"python": str(python), "llama_cpp": llama_cpp_version(str(python))}))


if __name__ == "__main__":
    main()
