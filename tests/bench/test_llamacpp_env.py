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
