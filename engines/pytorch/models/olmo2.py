"""OLMo 2: no norm before the blocks; each block's output is normed before its residual add
(x + norm(attn(x)), x + norm(mlp(x))), and q and k are normed over the whole projection before the heads split."""

from __future__ import annotations

from typing import Any

from engines.pytorch.gguf_blocks import WeightBlocks
from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.layers.projections import Kernels
from engines.pytorch.layers.rotary import Rotary
from engines.pytorch.models.decoder import DecoderLayer, DecoderModel, attention, gated_mlp, layer_blocks

MODEL_TYPES = ("olmo2",)


def build(hf_model: Any, blocks: dict[str, WeightBlocks] | None, kernels: Kernels, packed: Any) -> DecoderModel:
    config = hf_model.config
    layers = []
    for i, hf_layer in enumerate(hf_model.model.layers):
        own = layer_blocks(blocks, i)
        layers.append(
            DecoderLayer(
                attn=attention(hf_layer, i, config, own, kernels, norm_whole_projection=True),
                mlp=gated_mlp(hf_layer, own, kernels),
                input_norm=None,
                post_norm=None,
                attn_out_norm=RMSNorm(hf_layer.post_attention_layernorm),
                mlp_out_norm=RMSNorm(hf_layer.post_feedforward_layernorm),
            )
        )
        packed(own.values())
    return DecoderModel(
        layers, RMSNorm(hf_model.model.norm), Rotary(hf_model.model.rotary_emb, config), llama_shaped=False
    )
