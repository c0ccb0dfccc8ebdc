"""Phi-3 and Phi-4-mini: Llama's layer with q/k/v and gate/up fused in the checkpoint (`qkv_proj`, `gate_up_proj`),
LongRoPE (rotary.py picks the short or long factors per row as transformers does per call) and, in Phi-4-mini,
partial rotary (a part of each head rotates: q's and k's dimensions are reordered so the full-width rotation of
the kernels computes it, rotary.py `partial_order`)."""

from __future__ import annotations

from typing import Any

import torch

from engines.pytorch.gguf_blocks import WeightBlocks
from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.layers.projections import Kernels
from engines.pytorch.layers.rotary import Rotary, partial_order
from engines.pytorch.models.decoder import DecoderModel
from engines.pytorch.models.llama import llama_layers

MODEL_TYPES = ("phi3",)


def _reorder_qk(hf_model: Any, blocks: dict[str, WeightBlocks] | None, order: torch.Tensor) -> None:
    """q's and k's rows of every layer's qkv_proj (and GGUF blocks) in `order` within each head (rotary.py
    `partial_order`); v's rows stay."""
    config = hf_model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = order.numel()
    rows = torch.cat([h * head_dim + order for h in range(heads + kv_heads)])
    rows = torch.cat((rows, torch.arange((heads + kv_heads) * head_dim, (heads + 2 * kv_heads) * head_dim)))
    for i, layer in enumerate(hf_model.model.layers):
        proj = layer.self_attn.qkv_proj
        if not proj.weight.is_meta:
            proj.weight.data = proj.weight.data[rows]
        if proj.bias is not None:
            proj.bias.data = proj.bias.data[rows]
        key = f"model.layers.{i}.self_attn.qkv_proj"
        if blocks is not None and key in blocks:
            blocks[key] = blocks[key].rows(rows)


def build(hf_model: Any, blocks: dict[str, WeightBlocks] | None, kernels: Kernels, packed: Any) -> DecoderModel:
    config = hf_model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rotary = Rotary(hf_model.model.rotary_emb, config, head_dim)
    rotated = rotary.width()
    if rotated < head_dim:  # partial rotary (Phi-4-mini)
        _reorder_qk(hf_model, blocks, partial_order(head_dim, rotated))
    layers = llama_layers(hf_model, blocks, kernels, packed)
    return DecoderModel(layers, RMSNorm(hf_model.model.norm), rotary, llama_shaped=False)
