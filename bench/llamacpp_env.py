"""Where llama.cpp lives for the benchmark and the tests, how it is built, and its quantizer.

llama.cpp's quantizer makes the GGUF test files of every block type, and llama.cpp is the peer a CPU user compares us
with (bench/llamacpp_bench.py). The quantizer (and the benchmark's llama-cpp-python wrappers) come from PyPI as
llama-cpp-python, built from source (PyPI has no binary wheels).
Its `server` extra pins fastapi/uvicorn/starlette versions our environment must not take, so it lives in a virtual
environment of its own and is only ever run as a subprocess of that environment's Python, never imported here.

The Python of that environment is found, in order, from:
  1. $SWITCHYARD_LLAMA_PYTHON (an error when it is set but cannot import llama_cpp: a CI run must not skip);
  2. `.venv-llama/bin/python` in the repository root (`.ci/run` and `--setup` build it there).
Tests that need llama.cpp skip with a message pointing here when neither exists.

The benchmarks' anchor is llama.cpp's own `llama-server` (what users of llama.cpp and Ollama run), built with CMake
from the `vendor/llama.cpp` of the same release's sdist (`--server`); the sdist also carries llama.cpp's
`convert_hf_to_gguf.py`, its `conversion/` package and `gguf-py`, which bench/real_size_models.py converts with. Both
are kept under build/llama.cpp/ (ignored by git). The binary is found from $SWITCHYARD_LLAMA_SERVER, else there.
`converter_source` is that converter's folder in the cache (the same extraction); `converter_packages` installs
what the converter needs beyond torch, transformers and numpy (sentencepiece) into a folder of its own for the
Python that runs it (bench/gguf_convert.py uses both).

Stdlib only: `.ci/run` runs this file with bare Python before any environment exists:

    python3 bench/llamacpp_env.py --setup [--venv .venv-llama]   # build it (minutes, from source)
    python3 bench/llamacpp_env.py --server [--sdist FILE]        # build llama-server (12 CPU-minutes)
    python3 bench/llamacpp_env.py --converter                    # fetch the converter (sdist), print its folder
    python3 bench/llamacpp_env.py                                # print the Python (and server) found, or exit 1
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
VERSION = REQUIREMENT.rpartition("==")[2]
SERVER_ENV_VAR = "SWITCHYARD_LLAMA_SERVER"
BUILD_DIR = ROOT / "build" / "llama.cpp"
# llama-server's CPU kernels are chosen by explicit flags, not -march=native (GGML_NATIVE=OFF), so the build says
# what it uses: each instruction set of this CPU (its /proc/cpuinfo flag) that ggml has an option for. Never AMX:
# llama.cpp's AMX path crashed on our Xeons, and the tile unit is what our own decode avoids for exactness.
GGML_CPU_OPTIONS = (
    ("sse4_2", "GGML_SSE42"),
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("bmi2", "GGML_BMI2"),
    ("avx_vnni", "GGML_AVX_VNNI"),
    ("avx512f", "GGML_AVX512"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
)
# GGML_AVX512 turns on F, CD, VL, DQ and BW together
AVX512_BASE = ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")
SERVER_CMAKE = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_OPENSSL=OFF",
    # the web UI's assets are fetched from a hub or built with npm: neither is wanted here
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)
SERVER_MISSING = (
    f"llama-server not found: set {SERVER_ENV_VAR} to a llama-server binary, or build one with "
    "`python3 bench/llamacpp_env.py --server` (docs/benchmarks.md)"
)
MISSING = (
    f"llama-cpp-python not found: set {ENV_VAR} to the Python of an environment with {REQUIREMENT!r}, or "
    "build one with `python3 bench/llamacpp_env.py --setup` (docs/testing.md)"
)


class LlamaCppUnavailable(RuntimeError):
    """$SWITCHYARD_LLAMA_PYTHON names a Python that cannot run llama.cpp (a setup error, not a reason to skip)."""


class ConverterUnavailable(RuntimeError):
    """llama.cpp's converter could not be fetched (no package index reachable): tests that need it skip on it."""


def cache_root() -> Path:
    """The project's cache folder (as engines/pytorch/loader.py's default_cache_dir, without importing torch)."""
    env = os.environ.get("SWITCHYARD_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "switchyard"


def _pip(python: str, *args: str) -> None:
    run = subprocess.run(
        [python, "-m", "pip", "--disable-pip-version-check", *args], check=False, capture_output=True, text=True
    )
    if run.returncode != 0:
        raise ConverterUnavailable(
            f"pip {args[0]} failed (exit {run.returncode}); llama.cpp's converter comes "
            f"from PyPI's {SDIST} sdist, so a package index must be reachable once:\n"
            f"{run.stderr[-2000:]}"
        )


def converter_source(cache_dir: Path | None = None) -> Path:
    """The llama.cpp source folder of the pinned sdist (`convert_hf_to_gguf.py`, `conversion/`, `gguf-py/`),
    downloaded and extracted on first use into `cache_dir` (default: cache_root()) / llama-cpp-sdist."""
    return llama_cpp_source(build_dir=(cache_dir or cache_root()) / "llama-cpp-sdist")


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
        run = subprocess.run(
            [python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return run.stdout.strip() if run.returncode == 0 else None


def find_llama_python() -> Path | None:
    """The Python that runs llama.cpp (see the module's docstring for the order), or None when there is none."""
    named = os.environ.get(ENV_VAR)
    if named:
        if llama_cpp_version(named) is None:
            raise LlamaCppUnavailable(
                f"{ENV_VAR}={named} cannot import llama_cpp; point it at the Python of an "
                f"environment with {REQUIREMENT!r} or unset it"
            )
        return Path(named)
    default = DEFAULT_VENV / "bin" / "python"
    if default.exists() and llama_cpp_version(str(default)) is not None:
        return default
    return None


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def _cpu_has_amx() -> bool:
    return "amx_tile" in _cpu_flags()


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


def quantize(
    source: Path, destination: Path, type_name: str, llama_python: Path | None = None, threads: int = 2
) -> Path:
    """`destination`, made from `source` by llama.cpp's quantizer as `type_name` (Q4_0, Q4_K_M, Q6_K, Q8_0, F16...),
    unless it exists already. Raises LlamaCppUnavailable when there is no llama.cpp (see find_llama_python)."""
    if destination.exists():
        return destination
    python = llama_python or find_llama_python()
    if python is None:
        raise LlamaCppUnavailable(MISSING)
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".partial")
    run = subprocess.run(
        [str(python), "-c", _QUANTIZE, str(source), str(partial), type_name, str(threads)],
        check=False,
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(
            f"llama.cpp could not quantize {source.name} to {type_name} (exit {run.returncode}):\n{run.stderr[-3000:]}"
        )
    partial.replace(destination)
    return destination


# ------------------------------------------------------------------------------------- the sdist and llama-server
def _pip_python() -> str:
    """A Python with pip: ours, else the llama.cpp environment's (bare system Pythons often have no pip)."""
    for python in (sys.executable, str(DEFAULT_VENV / "bin" / "python"), str(ROOT / ".venv" / "bin" / "python")):
        if (
            Path(python).exists()
            and subprocess.run([python, "-m", "pip", "--version"], check=False, capture_output=True).returncode == 0
        ):
            return python
    raise LlamaCppUnavailable("no Python with pip to download the llama-cpp-python sdist; pass --sdist FILE")


def llama_cpp_source(sdist: Path | None = None, build_dir: Path = BUILD_DIR) -> Path:
    """llama.cpp's source tree (the sdist's vendor/llama.cpp) of the pinned release, extracted once under
    `build_dir` from `sdist` or from the sdist pip downloads (`pip download --no-binary :all: --no-deps`)."""
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp"
    source = build_dir / prefix
    if (source / "CMakeLists.txt").is_file() and (source / "convert_hf_to_gguf.py").is_file():
        return source
    build_dir.mkdir(parents=True, exist_ok=True)
    if sdist is None:
        sdist = build_dir / f"llama_cpp_python-{VERSION}.tar.gz"
        if not sdist.is_file():
            _pip(_pip_python(), "download", "-q", "--no-binary", ":all:", "--no-deps", "-d", str(build_dir), SDIST)
    partial = build_dir / f".extract-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name == prefix or m.name.startswith(prefix + "/")]
        if not members:
            raise LlamaCppUnavailable(f"{sdist} has no {prefix}: not the llama-cpp-python {VERSION} sdist")
        archive.extractall(partial, members=members, filter="data")
    shutil.rmtree(build_dir / f"llama_cpp_python-{VERSION}", ignore_errors=True)
    (partial / f"llama_cpp_python-{VERSION}").rename(build_dir / f"llama_cpp_python-{VERSION}")
    partial.rmdir()
    return source


def server_cmake_options(flags: set[str] | None = None) -> list[str]:
    """The CMake options of the llama-server build: the fixed ones and this CPU's instruction sets (see
    GGML_CPU_OPTIONS), every known set named ON or OFF so a cached build never keeps another CPU's choice."""
    flags = _cpu_flags() if flags is None else flags
    avx512 = all(f in flags for f in AVX512_BASE)
    options = list(SERVER_CMAKE)
    for flag, option in GGML_CPU_OPTIONS:
        have = avx512 if option == "GGML_AVX512" else flag in flags and (avx512 or "AVX512" not in option)
        options.append(f"-D{option}={'ON' if have else 'OFF'}")
    return options


def server_build_folder(options: list[str], build_dir: Path = BUILD_DIR) -> Path:
    """One CMake build folder per set of options (a machine with other instruction sets builds anew)."""
    return build_dir / f"server-{hashlib.sha256(' '.join(options).encode()).hexdigest()[:12]}"


def find_llama_server(build_dir: Path = BUILD_DIR) -> Path | None:
    """$SWITCHYARD_LLAMA_SERVER (an error when it names no executable), else the binary --server built for this
    CPU, else None."""
    named = os.environ.get(SERVER_ENV_VAR)
    if named:
        if not os.access(named, os.X_OK):
            raise LlamaCppUnavailable(
                f"{SERVER_ENV_VAR}={named} is not an executable llama-server; build one with "
                "`python3 bench/llamacpp_env.py --server` or unset it"
            )
        return Path(named)
    binary = server_build_folder(server_cmake_options(), build_dir) / "bin" / "llama-server"
    return binary if binary.is_file() else None


def build_server(sdist: Path | None = None, build_dir: Path = BUILD_DIR, jobs: int | None = None) -> Path:
    """llama-server built with CMake from the pinned sdist's llama.cpp for this CPU (see server_cmake_options),
    unless built already; returns the binary. Needs cmake and a C++ compiler; 12 minutes of CPU time."""
    options = server_cmake_options()
    folder = server_build_folder(options, build_dir)
    binary = folder / "bin" / "llama-server"
    if binary.is_file():
        return binary
    cmake = shutil.which("cmake")
    if cmake is None:
        raise LlamaCppUnavailable("cmake not found: install it (`apt-get install cmake` or `pip install cmake`)")
    source = llama_cpp_source(sdist, build_dir)
    start = time.monotonic()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run([cmake, "-S", str(source), "-B", str(folder), *generator, *options], check=True)
    subprocess.run(
        [cmake, "--build", str(folder), "--target", "llama-server", "-j", str(jobs or os.cpu_count() or 1)], check=True
    )
    (folder / "cmake-options.txt").write_text("\n".join(options) + "\n")
    print(f"built {binary} in {time.monotonic() - start:.0f} s with {' '.join(options)}", file=sys.stderr)
    return binary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="store_true", help="build the environment unless it runs llama_cpp already")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="where --setup builds (default: %(default)s)")
    parser.add_argument("--server", action="store_true", help="build llama-server from the sdist unless built already")
    parser.add_argument(
        "--sdist", type=Path, help="the llama-cpp-python sdist to build from (default: pip downloads it)"
    )
    parser.add_argument(
        "--converter", action="store_true", help="fetch llama.cpp's converter (the sdist) and print its folder"
    )
    args = parser.parse_args()
    if args.converter:
        print(json.dumps({"converter": str(converter_source()), "packages": str(converter_packages())}))
        return
    if args.server:
        print(json.dumps({"llama_server": str(build_server(args.sdist.resolve() if args.sdist else None))}))
        return
    if args.setup:
        python = setup(args.venv.resolve())
    else:
        found = find_llama_python()
        if found is None:
            sys.exit(MISSING)
        python = found
    server = find_llama_server()
    print(
        json.dumps(
            {
                "python": str(python),
                "llama_cpp": llama_cpp_version(str(python)),
                "llama_server": str(server) if server else None,
            }
        )
    )


if __name__ == "__main__":
    main()
