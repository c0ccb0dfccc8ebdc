"""gpt-oss: Llama's pre-norm layer with biased q/k/v/o projections, attention sinks (a learned logit per head in the
softmax's denominator), sliding-window attention on alternate layers (`layer_types`), YaRN rotary scaling, and a
sparse MoE block (layers/moe.py's `SparseMoE`) whose router has a bias and softmaxes its top-k logits and whose
experts are biased projections around a clamped SwiGLU (layers/swiglu.py).

Attention with sinks runs on the paged C kernels (paged_attention.py; `attend_torch` without them); in float32 on
the kernels the MoE block after its router is one C call (moe_experts.py: the top-k-then-softmax routing, the
experts' biases and the clamped SwiGLU in csrc/moe.c), so decode steps are kernel calls only and the step replay
records them like Qwen3-MoE's. From a GGUF file the experts of a type the kernels read are the file's blocks
(expert_blocks.py: gate and up rows apart, as llama.cpp's converter writes them), their biases transformers'
parameters."""

from __future__ import annotations

from typing import Any

import torch

from engines.pytorch.expert_blocks import LayerExperts
from engines.pytorch.gguf_blocks import GGUFBlocks, WeightBlocks
from engines.pytorch.layers.mlp import MLP
from engines.pytorch.layers.moe import Routing, SparseMoE
from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.layers.projections import Kernels
from engines.pytorch.layers.rotary import Rotary
from engines.pytorch.layers.swiglu import ClampedSwiGLU
from engines.pytorch.linear import Linear
from engines.pytorch.models.decoder import DecoderModel
from engines.pytorch.models.llama import llama_layers

MODEL_TYPES = ("gpt_oss",)


class _FullWidthTables:
    """transformers' gpt-oss rotary module gives cos and sin once per frequency ([.., D / 2]) and rotates a head's
    halves (x[:D/2], x[D/2:]) by them; the engine's tables repeat them over both halves ([.., D]): the same
    rotation, the same bits."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.rope_type = module.rope_type

    def __call__(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._module(x, position_ids)
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)


def _expert(experts: Any, e: int, held: LayerExperts | None, kernels: Kernels) -> tuple[Linear, Linear]:
    """Expert e's [gate | up] and down projections with their biases: from the GGUF blocks `held`, or from
    transformers' `gate_up_proj` [E, H, 2 I] (gate and up interleaved along the last dimension) and `down_proj`
    [E, I, H]. The biases are transformers' (`gate_up_proj_bias` [E, 2 I], interleaved too; `down_proj_bias`)."""
    gate_up_bias = experts.gate_up_proj_bias[e].detach()
    bias = torch.cat((gate_up_bias[0::2], gate_up_bias[1::2])).contiguous()
    down_bias = experts.down_proj_bias[e].detach().contiguous()
    if held is not None:
        gate_up = GGUFBlocks.cat([held.gate.expert(e), held.up.expert(e)])
        return kernels.linear(None, bias, gate_up), kernels.linear(None, down_bias, held.down.expert(e))
    weight = experts.gate_up_proj[e].detach().t()  # [2 I, H], rows gate, up, gate, up ...
    halves = torch.cat((weight[0::2], weight[1::2])).contiguous()
    down = experts.down_proj[e].detach().t().contiguous()
    return kernels.linear(halves, bias), kernels.linear(down, down_bias)


def _moe(block: Any, config: Any, kernels: Kernels, held: LayerExperts | None = None) -> SparseMoE:
    """transformers' `GptOssMLP`: `router` (weight, bias) and `experts` (their weights there or `held` as blocks)."""
    router, experts = block.router, block.experts
    made = []
    for e in range(int(config.num_local_experts)):
        gate_up, down = _expert(experts, e, held, kernels)
        made.append((ClampedSwiGLU(gate_up, experts.alpha, experts.limit), down))
    router_linear = kernels.linear(router.weight.detach(), router.bias.detach())
    return SparseMoE.over(router_linear, made, Routing.of(config), int(config.hidden_size), kernels)


def build(hf_model: Any, blocks: dict[str, WeightBlocks] | None, kernels: Kernels, packed: Any) -> DecoderModel:
    config = hf_model.config

    def mlp(hf_layer: Any, own: dict[str, WeightBlocks], kernels: Kernels) -> MLP:
        return _moe(hf_layer.mlp, config, kernels, LayerExperts.held(own))

    layers = llama_layers(hf_model, blocks, kernels, packed, mlp=mlp)
    rotary = Rotary(_FullWidthTables(hf_model.model.rotary_emb), config)
    return DecoderModel(layers, RMSNorm(hf_model.model.norm), rotary, llama_shaped=False)
