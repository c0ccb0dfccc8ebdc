"""Which models the Ollama API lists before they are loaded, told apart by their config alone: LLMs and the
tensor models with the embedding contract, not the other tensor models (the default repository's configs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.ollama.listing import config_embeds, listable
from gateway.repository.model_config import parse_model_config
from tests.conftest import ROOT


def _config(folder: str, root: Path = ROOT / "model_repository"):  # noqa: ANN202
    return parse_model_config(next((root / folder).glob("config.*")), folder)


@pytest.mark.parametrize(
    ("folder", "embeds", "listed"),
    [
        ("smollm2-135m-instruct", False, True),
        ("all-minilm-l6-v2", True, True),
        ("circle_classifier", False, False),
        ("circle_pipeline", False, False),
    ],
)
def test_llms_and_embedding_models_are_listed(folder: str, embeds: bool, listed: bool) -> None:
    config = _config(folder)
    assert (config_embeds(config), listable(config)) == (embeds, listed)


def test_a_task_embed_model_without_declared_tensors_embeds(tmp_path: Path) -> None:
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "config.yaml").write_text(
        "backend: transformers\nmax_batch_size: 4\nparameters:\n  task: embed\n"
    )
    assert config_embeds(_config("e", tmp_path))
