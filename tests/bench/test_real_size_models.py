"""The real-size benchmark models (bench/real_size_models.py) have the published models' exact shapes: their
weight counts are the published ones, and a Llama's tensor names and shapes are transformers' own."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

from bench.real_size_models import MODELS, config_of, parameter_count, tensor_shapes

# the weight counts of Llama-3.2-1B, Llama-3.2-3B, Llama-3.1-8B, Qwen3-30B-A3B (48 layers) and gpt-oss-20b (24)
PUBLISHED = {
    "llama-1b": 1_235_814_400,
    "llama-3b": 3_212_749_824,
    "llama-8b": 8_030_261_248,
    "qwen3-moe": 30_532_122_624,
    "gpt-oss": 20_914_757_184,
}


@pytest.mark.parametrize("name", list(MODELS))
def test_weight_counts_are_the_published_ones(name: str) -> None:
    assert parameter_count(config_of(name, moe_layers=MODELS[name]["num_hidden_layers"])) == PUBLISHED[name]


def test_the_moe_is_scaled_in_layers_only() -> None:
    small, full = config_of("qwen3-moe", moe_layers=12), config_of("qwen3-moe", moe_layers=48)
    assert small["num_hidden_layers"] == 12
    assert {k: v for k, v in small.items() if k != "num_hidden_layers"} == {
        k: v for k, v in full.items() if k != "num_hidden_layers"
    }
    assert (small["num_experts_per_tok"], small["moe_intermediate_size"]) == (8, 768)


@pytest.mark.parametrize("name", ["llama-1b", "llama-8b"])  # tied and untied
def test_llama_tensors_are_transformers_own(name: str) -> None:
    config = config_of(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**config))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if config["tie_word_embeddings"]:
        expected.pop("lm_head.weight")
    assert dict(tensor_shapes(config)) == expected


def test_gpt_oss_tensors_are_transformers_own_and_its_layers_alternate() -> None:
    config = config_of("gpt-oss")
    assert config["num_hidden_layers"] == 8
    assert config["layer_types"] == ["sliding_attention", "full_attention"] * 4
    made = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "model_type"}, model_type="gpt_oss")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(made)
    assert dict(tensor_shapes(config)) == {k: tuple(v.shape) for k, v in model.state_dict().items()}
