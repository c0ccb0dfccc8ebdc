"""Mixture-of-experts families on Llama's layer, the MLP slot filled by layers/moe.py's `SparseMoE`: Qwen3-MoE
(Qwen3's per-head q/k norms; `mlp_only_layers` and `decoder_sparse_step` leave some layers dense) and Mixtral
(Mistral's attention, sliding window where the config sets one).

GGUF blocks of a layer's experts, where the loader keeps them (expert_blocks.py), are `ExpertBlocks` under the
layer's `mlp.experts.gate_proj`, `up_proj` and `down_proj`; the router's (if not float) under `mlp.gate`."""

from __future__ import annotations

from typing import Any

from engines.pytorch.expert_blocks import LayerExperts
from engines.pytorch.gguf_blocks import WeightBlocks
from engines.pytorch.layers.mlp import MLP
from engines.pytorch.layers.moe import SparseMoE
from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.layers.projections import Kernels
from engines.pytorch.layers.rotary import Rotary
from engines.pytorch.models.decoder import DecoderModel, gated_mlp
from engines.pytorch.models.llama import llama_layers

MODEL_TYPES = ("qwen3_moe", "mixtral")


def _mlp(hf_layer: Any, config: Any, own: dict[str, Any], kernels: Kernels) -> MLP:
    """The layer's sparse block, or its dense MLP (a Qwen3-MoE layer in `mlp_only_layers`)."""
    if hasattr(hf_layer.mlp, "experts"):
        return SparseMoE.build(hf_layer.mlp, config, kernels, LayerExperts.held(own), own.get("gate"))
    return gated_mlp(hf_layer, own, kernels)


def build(hf_model: Any, blocks: dict[str, WeightBlocks] | None, kernels: Kernels, packed: Any) -> DecoderModel:
    config = hf_model.config
    layers = llama_layers(
        hf_model, blocks, kernels, packed, mlp=lambda hf_layer, own, kernels: _mlp(hf_layer, config, own, kernels)
    )
    # exact_forward.py (match_transformers) runs dense Llama layers only
    return DecoderModel(
        layers, RMSNorm(hf_model.model.norm), Rotary(hf_model.model.rotary_emb, config), llama_shaped=False
    )
