"""How the tests and the llama.cpp benchmark find llama.cpp (bench/llamacpp_env.py): a CI run that names a broken
environment must fail, not skip; a machine without one skips with a message that says how to get it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import llamacpp_env
from bench.llamacpp_env import ENV_VAR, LlamaCppUnavailable, find_llama_python, quantize


@pytest.fixture
def no_default_venv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setattr(llamacpp_env, "DEFAULT_VENV", tmp_path / "absent")
    monkeypatch.delenv(ENV_VAR, raising=False)
    return tmp_path


def test_none_without_the_variable_or_the_default_venv(no_default_venv: Path) -> None:
    assert find_llama_python() is None


def test_a_named_python_without_llama_cpp_is_an_error(no_default_venv: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, str(no_default_venv / "bin" / "python"))  # a path that runs nothing
    with pytest.raises(LlamaCppUnavailable, match=ENV_VAR):
        find_llama_python()


def test_quantize_without_llama_cpp_says_how_to_get_it(no_default_venv: Path) -> None:
    with pytest.raises(LlamaCppUnavailable, match=r"bench/llamacpp_env\.py --setup"):
        quantize(no_default_venv / "in.gguf", no_default_venv / "out.gguf", "Q4_K_M")
    assert not (no_default_venv / "out.gguf").exists()


# ------------------------------------------------------------------------------------------------ llama-server
SAPPHIRE_RAPIDS = {
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "sse4_2",
    "avx_vnni",
    "avx512f",
    "avx512cd",
    "avx512vl",
    "avx512dq",
    "avx512bw",
    "avx512vbmi",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
}


def test_the_server_build_takes_the_cpus_avx512_sets_and_never_amx() -> None:
    options = llamacpp_env.server_cmake_options(SAPPHIRE_RAPIDS)
    assert "-DGGML_NATIVE=OFF" in options
    for on in ("GGML_AVX2", "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX_VNNI"):
        assert f"-D{on}=ON" in options
    for off in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16"):
        assert f"-D{off}=OFF" in options and f"-D{off}=ON" not in options


def test_an_avx512_extension_without_the_base_set_stays_off() -> None:
    options = llamacpp_env.server_cmake_options({"avx", "avx2", "fma", "f16c", "avx512_vnni", "avx512f"})
    assert "-DGGML_AVX2=ON" in options
    assert "-DGGML_AVX512=OFF" in options and "-DGGML_AVX512_VNNI=OFF" in options


def test_each_cpu_gets_its_own_build_folder(tmp_path: Path) -> None:
    avx2 = llamacpp_env.server_cmake_options({"avx", "avx2", "fma", "f16c"})
    avx512 = llamacpp_env.server_cmake_options(SAPPHIRE_RAPIDS)
    assert llamacpp_env.server_build_folder(avx2, tmp_path) != llamacpp_env.server_build_folder(avx512, tmp_path)


def test_no_server_without_the_variable_or_a_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(llamacpp_env.SERVER_ENV_VAR, raising=False)
    assert llamacpp_env.find_llama_server(tmp_path) is None


def test_a_named_server_that_is_not_executable_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(llamacpp_env.SERVER_ENV_VAR, str(tmp_path / "llama-server"))
    with pytest.raises(LlamaCppUnavailable, match=llamacpp_env.SERVER_ENV_VAR):
        llamacpp_env.find_llama_server(tmp_path)
