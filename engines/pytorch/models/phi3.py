"""Phi-3 and Phi-4-mini: Llama's layer with q/k/v and gate/up fused in the checkpoint (`qkv_proj`, `gate_up_proj`)
and LongRoPE (rotary.py picks the short or long factors per row as transformers does per call)."""

from __future__ import annotations

from typing import Any

from engines.interface import UnsupportedModelError
from engines.pytorch.gguf_blocks import WeightBlocks
from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.layers.projections import Kernels
from engines.pytorch.layers.rotary import Rotary
from engines.pytorch.models.decoder import DecoderModel
from engines.pytorch.models.llama import llama_layers

MODEL_TYPES = ("phi3",)


def build(hf_model: Any, blocks: dict[str, WeightBlocks] | None, kernels: Kernels, packed: Any) -> DecoderModel:
    config = hf_model.config
    if (getattr(config, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise UnsupportedModelError(f"{config.model_type} with partial_rotary_factor "
                                    f"{config.partial_rotary_factor} is not supported by the native engine; "
                                    "use backend: vllm for it")
    layers = llama_layers(hf_model, blocks, kernels, packed)
    return DecoderModel(layers, RMSNorm(hf_model.model.norm), Rotary(hf_model.model.rotary_emb, config),
                        llama_shaped=False)
