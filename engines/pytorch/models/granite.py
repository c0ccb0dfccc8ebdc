"""Granite: Llama's layer with multipliers -- the embeddings times `embedding_multiplier`, each block's output
times `residual_multiplier` before its residual add, scores times `attention_multiplier` (the attention's scaling),
the logits divided by `logits_scaling`. The residual multiplier (with its add) and the logits' division are kernels
(dense_ops.DenseOps), so float32 decode steps replay (step_replay.py)."""

from __future__ import annotations

from typing import Any

from engines.pytorch.gguf_blocks import WeightBlocks
from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.layers.projections import Kernels
from engines.pytorch.layers.rotary import Rotary
from engines.pytorch.models.decoder import DecoderModel
from engines.pytorch.models.llama import llama_layers

MODEL_TYPES = ("granite",)


def build(hf_model: Any, blocks: dict[str, WeightBlocks] | None, kernels: Kernels, packed: Any) -> DecoderModel:
    config = hf_model.config
    layers = llama_layers(hf_model, blocks, kernels, packed)
    for layer in layers:
        layer.residual_multiplier = config.residual_multiplier
    embedding, logits = config.embedding_multiplier, config.logits_scaling
    return DecoderModel(
        layers,
        RMSNorm(hf_model.model.norm),
        Rotary(hf_model.model.rotary_emb, config),
        embed_scale=lambda x: x * embedding,  # before the replayed part of a step (model_runner.py)
        logits_divisor=logits,
        llama_shaped=False,
    )
