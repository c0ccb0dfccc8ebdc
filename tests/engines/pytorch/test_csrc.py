"""The C sources of the native engine (engines/pytorch/csrc/): they build without a warning on every instruction set
they have paths for, and each library's ctypes table (its one declaration in Python) matches the C definitions."""

from __future__ import annotations

import ctypes
import fnmatch
import re
import shutil
import subprocess
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from engines.pytorch import argmax, gemm_library, lora_kernel, moe_experts, native, paged_attention, step_replay
from engines.pytorch.native import CFLAGS, CSRC

CC = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")

TABLES = {
    "gemm": gemm_library._SIGNATURES,
    "paged_attention": paged_attention._SIGNATURES,
    "argmax": argmax._SIGNATURES,
    "pool": native.POOL_SIGNATURES,
    "step_replay": step_replay._SIGNATURES,
    "moe": moe_experts.SIGNATURES,
    "lora": lora_kernel.SIGNATURES,
}
# The forced paths: AVX2 only (no AVX-512), AVX-512 without the tile unit, AMX; and no AVX2 at all for the libraries
# that have a scalar path (linear.py uses gemm only where the CPU has AVX2 and FMA).
MARCHES = {
    "x86-64": ("paged_attention", "argmax", "pool", "step_replay", "moe", "lora"),
    "haswell": tuple(TABLES),
    "skylake-avx512": tuple(TABLES),
    "sapphirerapids": tuple(TABLES),
}
FLAGS = [f for f in CFLAGS if not f.startswith("-march=")]


def _compile(march: str, name: str) -> tuple[str, str, int, str]:
    proc = subprocess.run(
        [CC, *FLAGS, f"-march={march}", "-Werror", "-o", "/dev/null", str(CSRC / f"{name}.c")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return march, name, proc.returncode, proc.stderr


@pytest.mark.slow  # compiles every library for every instruction set it has paths for (minutes on 2 cores)
def test_every_library_builds_without_a_warning_on_every_path() -> None:
    jobs = [(march, name) for march, names in MARCHES.items() for name in names]
    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [r for r in pool.map(lambda job: _compile(*job), jobs) if r[2] != 0]
    assert not failures, "\n".join(f"{name} -march={march}:\n{err[-2000:]}" for march, name, _, err in failures)


_C_TYPES: dict[str, Any] = {
    "int": ctypes.c_int,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
    "void": None,
    "task_fn": ctypes.c_void_p,
}


def _ctype(decl: str) -> Any:
    """The ctypes type of a C parameter or return type (`const float* x` -> c_void_p)."""
    if "*" in decl:
        return ctypes.c_void_p
    words = [w for w in re.findall(r"\w+", decl) if w != "const"]
    return _C_TYPES[words[0]]


def _definitions(name: str) -> dict[str, tuple[Any, list[Any]]]:
    """The exported (non-static) functions the preprocessed library defines: name -> (restype, argtypes)."""
    text = subprocess.run(
        [CC, *FLAGS, "-march=sapphirerapids", "-E", "-P", str(CSRC / f"{name}.c")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    found: dict[str, tuple[Any, list[Any]]] = {}
    for ret, fn, params in re.findall(r"^(int|void)\s+(\w+)\s*\(([^)]*)\)\s*\{", text, flags=re.M):
        args = [p.strip() for p in params.split(",") if p.strip() not in ("", "void")]
        assert fn not in found, f"{fn} defined twice"
        found[fn] = (_ctype(ret), [_ctype(a) for a in args])
    return found


@pytest.mark.parametrize("name", sorted(TABLES))
def test_each_ctypes_signature_matches_its_c_definition(name: str) -> None:
    defined = _definitions(name)
    for fn, (restype, argtypes) in TABLES[name].items():
        assert fn in defined, f"{fn} is in {name}'s table but not defined in csrc/{name}.c"
        assert defined[fn] == (restype, argtypes), f"{name}.{fn}: table {restype, argtypes} != C {defined[fn]}"


def test_the_cache_key_covers_every_header(tmp_path: Path) -> None:
    """A change to any header a library may include builds it afresh."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "header_probe.c").write_text('#include "probe.h"\nint answer(void) { return ANSWER; }\n')
    (src / "probe.h").write_text("#define ANSWER 42\n")
    table = {"answer": (ctypes.c_int, [])}
    native._loaded.pop("header_probe", None)
    assert native.load_library("header_probe", tmp_path, table, source_dir=src).answer() == 42
    (src / "probe.h").write_text("#define ANSWER 43\n")
    native._loaded.pop("header_probe", None)
    assert native.load_library("header_probe", tmp_path, table, source_dir=src).answer() == 43
    assert len(list((tmp_path / "kernels").glob("header_probe-*.so"))) == 2


def test_every_source_ships_with_the_package() -> None:
    """pyproject's package data names every file in csrc/, so an installed engine can build its kernels."""
    config = tomllib.loads((CSRC.parents[2] / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["engines.pytorch"]
    files = [f.relative_to(CSRC.parent).as_posix() for f in CSRC.iterdir()]
    assert files and all(any(fnmatch.fnmatch(f, p) for p in patterns) for f in files), (files, patterns)
