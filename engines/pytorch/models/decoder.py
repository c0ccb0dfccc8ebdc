"""The shared decoder: layers of attention and MLP blocks around a residual stream, with the hooks families differ
in (where the norms sit, residual and embedding multipliers, logit scaling and soft-capping), each a C kernel
where the kernels run, so that a decode step is kernel calls only and replays (step_replay.py). A family file
(models/*.py) builds a `DecoderModel` from transformers' model of a checkpoint; the runner (model_runner.py) owns
the KV cache, the step's layout and the step replay, and runs the model's layers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engines.pytorch.gguf_blocks import WeightBlocks
from engines.pytorch.layers.attention import Attention, StepContext
from engines.pytorch.layers.mlp import MLP, GatedMLP
from engines.pytorch.layers.norms import RMSNorm, rms_norm
from engines.pytorch.layers.projections import Kernels, gate_up_activation, linear_of, qkv_projection
from engines.pytorch.layers.rotary import Rotary


@dataclass
class DecoderLayer:
    """x -> x + [attn_out_norm](attn([input_norm](x))) -> x + [mlp_out_norm](mlp([post_norm](x))), each added
    output times `residual_multiplier` where the family has one (Granite: one kernel with the add). `post_norm` is
    transformers' Llama `post_attention_layernorm` (after the attention's residual add, before the MLP). Llama:
    input_norm and post_norm; Gemma 2 and 3: all four ("sandwich"); OLMo 2: only the norms of the blocks' outputs.
    Without an output norm or multiplier the residual add is the projection's own (one kernel)."""

    attn: Attention
    mlp: MLP
    input_norm: RMSNorm | None
    post_norm: RMSNorm | None
    attn_out_norm: RMSNorm | None = None
    mlp_out_norm: RMSNorm | None = None
    residual_multiplier: float | None = None

    def projections(self) -> list[Any]:
        return [*self.attn.projections(), *self.mlp.projections()]

    def _add(
        self, residual: torch.Tensor, out: torch.Tensor, out_norm: RMSNorm | None, step: StepContext
    ) -> torch.Tensor:
        multiplier = self.residual_multiplier
        if out_norm is not None:
            if multiplier is None:
                return step.norm_add(out_norm, out, residual)
            out = step.norm(out_norm, out)
        return residual + out if multiplier is None else step.scale_add(out, multiplier, residual)

    def __call__(self, hidden: torch.Tensor, step: StepContext) -> torch.Tensor:
        nd = step.num_decode
        fused_add = self.attn_out_norm is None and self.residual_multiplier is None
        x = hidden if self.input_norm is None else step.norm(self.input_norm, hidden)
        if fused_add:
            hidden = self.attn(x, step, hidden)
        else:
            hidden = self._add(hidden, self.attn(x, step), self.attn_out_norm, step)
        x = hidden if self.post_norm is None else step.norm(self.post_norm, hidden)
        if self.mlp_out_norm is None and self.residual_multiplier is None:
            return self.mlp(x, hidden, prompt_from=nd)
        return self._add(hidden, self.mlp(x, prompt_from=nd), self.mlp_out_norm, step)


@dataclass
class DecoderModel:
    """A family's decoder as the runner runs it."""

    layers: list[DecoderLayer]
    norm: RMSNorm  # the final norm
    rotary: Rotary
    embed_scale: Callable[[torch.Tensor], torch.Tensor] | None = None  # embeddings -> what layer 0 reads
    final_softcap: float | None = None  # lm_head's output -> tanh(x / cap) * cap (Gemma 2's final_logit_softcapping)
    logits_divisor: float | None = None  # (capped) lm_head's output -> x / divisor (Granite's logits_scaling)
    # the layout transformers' layers are read from; `match_transformers` (exact_forward.py) runs Llama-shaped
    # models only: plain attention and the Llama norm placement
    llama_shaped: bool = True

    def projections(self) -> list[Any]:
        return [p for layer in self.layers for p in layer.projections()]


def layer_blocks(blocks: dict[str, WeightBlocks] | None, i: int) -> dict[str, WeightBlocks]:
    """The GGUF blocks of layer i's projections by module name (`q_proj`, `gate_proj`, ...)."""
    return {path.rsplit(".", 1)[1]: b for path, b in (blocks or {}).items() if path.startswith(f"model.layers.{i}.")}


def layer_types(config: Any) -> list[str]:
    """Each layer's attention kind ("full_attention" or "sliding_attention"), as transformers' config says."""
    types = getattr(config, "layer_types", None)
    if types:
        return list(types)[: config.num_hidden_layers]
    window = getattr(config, "sliding_window", None)
    return ["sliding_attention" if window else "full_attention"] * config.num_hidden_layers


def attention(
    hf_layer: Any,
    i: int,
    config: Any,
    blocks: dict[str, WeightBlocks],
    kernels: Kernels,
    *,
    unit_offset_norms: bool = False,
    norm_whole_projection: bool = False,
    softcap: float | None = None,
    rope: str | None = None,
) -> Attention:
    """Layer i's attention block from transformers' layer (its q/k/v, o, q/k norms, scaling, window, sinks)."""
    attn = hf_layer.self_attn
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(attn, "head_dim", None) or getattr(config, "head_dim", None) or config.hidden_size // heads
    sliding = layer_types(config)[i] == "sliding_attention"
    return Attention(
        layer_idx=i,
        qkv=qkv_projection(attn, blocks, kernels),
        o=linear_of(attn.o_proj, "o_proj", blocks, kernels),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        scaling=float(attn.scaling),
        q_norm=rms_norm(getattr(attn, "q_norm", None), unit_offset_norms),
        k_norm=rms_norm(getattr(attn, "k_norm", None), unit_offset_norms),
        norm_whole_projection=norm_whole_projection,
        sliding_window=config.sliding_window if sliding else None,
        softcap=softcap,
        rope=rope,
        # float32 for the kernels (exact from bfloat16; attend_torch casts them back to the scores' dtype)
        sinks=sinks.detach().float().contiguous() if (sinks := getattr(attn, "sinks", None)) is not None else None,
    )


def gated_mlp(hf_layer: Any, blocks: dict[str, WeightBlocks], kernels: Kernels) -> GatedMLP:
    """A layer's dense gated MLP from transformers' layer (`mlp.gate_proj`/`up_proj` or `gate_up_proj`,
    `down_proj`, `act_fn`)."""
    mlp = hf_layer.mlp
    act = getattr(mlp, "act_fn", None) or mlp.activation_fn
    return GatedMLP(
        gate_up_activation(mlp, act, blocks, kernels), linear_of(mlp.down_proj, "down_proj", blocks, kernels)
    )
