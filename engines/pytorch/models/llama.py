"""Llama and the families with its layer: Mistral (sliding window where the config sets one), Qwen2 / 2.5 (q/k/v
biases), Qwen3 (per-head q/k norms). Pre-norm layers: x + attn(norm(x)), then x + mlp(norm(x))."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engines.pytorch.gguf_blocks import WeightBlocks
from engines.pytorch.layers.mlp import MLP
from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.layers.projections import Kernels
from engines.pytorch.layers.rotary import Rotary
from engines.pytorch.models.decoder import DecoderLayer, DecoderModel, attention, gated_mlp, layer_blocks

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def llama_layers(
    hf_model: Any,
    blocks: dict[str, WeightBlocks] | None,
    kernels: Kernels,
    packed: Any,
    mlp: Callable[[Any, dict[str, WeightBlocks], Kernels], MLP] = gated_mlp,
) -> list[DecoderLayer]:
    """Llama-shaped layers of transformers' model (`packed(blocks)` after each layer's are held); `mlp` builds a
    layer's MLP slot from transformers' layer (a mixture-of-experts family passes its own)."""
    config = hf_model.config
    layers = []
    for i, hf_layer in enumerate(hf_model.model.layers):
        own = layer_blocks(blocks, i)
        layers.append(
            DecoderLayer(
                attn=attention(hf_layer, i, config, own, kernels),
                mlp=mlp(hf_layer, own, kernels),
                input_norm=RMSNorm(hf_layer.input_layernorm),
                post_norm=RMSNorm(hf_layer.post_attention_layernorm),
            )
        )
        packed(own.values())
    return layers


def build(hf_model: Any, blocks: dict[str, WeightBlocks] | None, kernels: Kernels, packed: Any) -> DecoderModel:
    layers = llama_layers(hf_model, blocks, kernels, packed)
    return DecoderModel(
        layers,
        RMSNorm(hf_model.model.norm),
        Rotary(hf_model.model.rotary_emb, hf_model.config),
        llama_shaped=all(layer.attn.plain for layer in layers),
    )
