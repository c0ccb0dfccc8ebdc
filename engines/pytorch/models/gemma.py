"""Gemma 2 and Gemma 3 (text): sandwich norms (before and after each block) with (1 + w) scales, embeddings times
sqrt(hidden), GELU-tanh gated MLP, `query_pre_attn_scalar` for the scores' scale, sliding-window layers between
global ones (`layer_types`). Gemma 2 soft-caps the attention scores and the final logits; Gemma 3 norms q and k per
head and has a rotary table per layer type (local and global RoPE)."""

from __future__ import annotations

from typing import Any

import torch

from engines.pytorch.gguf_blocks import WeightBlocks
from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.layers.projections import Kernels
from engines.pytorch.layers.rotary import Rotary
from engines.pytorch.models.decoder import DecoderLayer, DecoderModel, attention, gated_mlp, layer_blocks, layer_types

MODEL_TYPES = ("gemma2", "gemma3_text")


def build(hf_model: Any, blocks: dict[str, WeightBlocks] | None, kernels: Kernels, packed: Any) -> DecoderModel:
    config = hf_model.config
    rotary = Rotary(hf_model.model.rotary_emb, config)
    per_type = rotary.layer_types != [None]
    kinds = layer_types(config)
    layers = []
    for i, hf_layer in enumerate(hf_model.model.layers):
        own = layer_blocks(blocks, i)
        layers.append(
            DecoderLayer(
                attn=attention(
                    hf_layer,
                    i,
                    config,
                    own,
                    kernels,
                    unit_offset_norms=True,
                    softcap=getattr(config, "attn_logit_softcapping", None),
                    rope=kinds[i] if per_type else None,
                ),
                mlp=gated_mlp(hf_layer, own, kernels),
                input_norm=RMSNorm(hf_layer.input_layernorm, unit_offset=True),
                attn_out_norm=RMSNorm(hf_layer.post_attention_layernorm, unit_offset=True),
                post_norm=RMSNorm(hf_layer.pre_feedforward_layernorm, unit_offset=True),
                mlp_out_norm=RMSNorm(hf_layer.post_feedforward_layernorm, unit_offset=True),
            )
        )
        packed(own.values())
    scale = config.hidden_size**0.5
    cap = getattr(config, "final_logit_softcapping", None)

    gemma3 = config.model_type == "gemma3_text"

    def embed_scale(x: torch.Tensor) -> torch.Tensor:  # sqrt(hidden) in the rows' dtype, rounded as transformers does
        return x * (torch.tensor(scale).to(x.dtype) if gemma3 else torch.tensor(scale, dtype=x.dtype))

    return DecoderModel(
        layers,
        RMSNorm(hf_model.model.norm, unit_offset=True),
        rotary,
        embed_scale=embed_scale,
        final_softcap=cap,
        llama_shaped=False,
    )
