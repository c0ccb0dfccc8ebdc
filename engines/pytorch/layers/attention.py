"""A decoder layer's attention block over the paged KV cache.

q/k/v come from one fused projection; optional q/k norms (per head: Qwen3, Gemma 3; over the whole projection:
OLMo 2) run before the rotation. Attention itself is the runner's (`StepContext.attend`): the paged C kernels, a
sliding window, soft-capped scores and attention sinks (gpt-oss) included; `attend_torch` (transformers' eager rule)
where the kernels are off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.linear import Linear
from engines.pytorch.paged_attention import read_cache, rotate, write_cache


class StepContext(Protocol):
    """What a layer sees of the step it runs in (the runner's, model_runner.py)."""

    num_decode: int  # rows [0, num_decode) are decode rows; the projections keep them on one-token kernels

    def norm(self, norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        """`norm(x)` for rows x [T, H], on the norm kernel where it runs."""
        ...

    def norm_add(self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """`residual + norm(x)` (a block's output norm and the residual add after it), on one kernel where it runs."""
        ...

    def scale_add(self, x: torch.Tensor, scale: float, residual: torch.Tensor) -> torch.Tensor:
        """`residual + x * scale` (a block's output times a residual multiplier, then the residual add), on one
        kernel where it runs."""
        ...

    def head_norm(self, norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        """`norm(x)` over each head of x [T, heads, D] (a view of the qkv projection's rows), on the norm kernel
        where it runs."""
        ...

    def attend(self, attention: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Rotate q [T, H, D] and k [T, KVH, D], write k and v to the layer's cache slots, attend: [T, H * D]."""
        ...


@dataclass
class Attention:
    """One layer's attention: projections, q/k norms and what its scores are (scale, window, soft-cap)."""

    layer_idx: int  # its KV cache
    qkv: Linear
    o: Linear
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float
    q_norm: RMSNorm | None = None
    k_norm: RMSNorm | None = None
    norm_whole_projection: bool = False  # q/k norms over [T, H * D] (OLMo 2), not per head
    sliding_window: int | None = None  # a query at p sees keys at p - window < position <= p (transformers' rule)
    softcap: float | None = None  # scores -> tanh(scores / cap) * cap (Gemma 2)
    rope: str | None = None  # the rotary table's layer type (rotary.Tables)
    # gpt-oss: a learned logit per head [H] in each query's softmax denominator (a "sink" no value belongs to)
    sinks: torch.Tensor | None = None

    @property
    def plain(self) -> bool:
        """Plain causal attention over the whole context (no window, soft-cap or sinks): what match_transformers
        takes."""
        return self.sliding_window is None and self.softcap is None and self.sinks is None

    def projections(self) -> list[Any]:
        return [self.qkv, self.o]

    def __call__(self, x: torch.Tensor, step: StepContext, residual: torch.Tensor | None = None) -> torch.Tensor:
        """(residual +) the attention block's output for rows x [T, hidden]."""
        t, nd = x.shape[0], step.num_decode
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv(x, prompt_from=nd)
        q, k, v = qkv[:, : h * d], qkv[:, h * d : (h + kvh) * d], qkv[:, (h + kvh) * d :]
        if self.q_norm is not None and self.norm_whole_projection:
            q, k = step.norm(self.q_norm, q), step.norm(self.k_norm, k)
        q, k, v = q.view(t, h, d), k.view(t, kvh, d), v.view(t, kvh, d)
        if self.q_norm is not None and not self.norm_whole_projection:
            q, k = step.head_norm(self.q_norm, q), step.head_norm(self.k_norm, k)
        return self.o(step.attend(self, q, k, v), residual, prompt_from=nd)


@dataclass
class SequenceRows:
    """One sequence's rows in a step, for attention in torch ops."""

    first: int  # its first row
    count: int
    start_pos: int  # position of its first row
    slots: torch.Tensor  # cache slots of positions 0 .. start_pos + count - 1


def attend_torch(
    attention: Attention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    sequences: list[SequenceRows],
) -> torch.Tensor:
    """Eager attention as transformers computes it (scores, soft-cap, mask, float32 softmax, weighted values), one
    sequence at a time over its cache, with the layer's sliding window: [T, H * D]. With sinks, each head's sink
    logit joins its row's scores in the softmax (after the row's largest logit is subtracted, as transformers'
    gpt-oss does) and its probability is dropped: the row's weights then sum to less than one."""
    h, kvh, d = attention.num_heads, attention.num_kv_heads, attention.head_dim
    q, k = rotate(q, cos[:, None], sin[:, None]), rotate(k, cos[:, None], sin[:, None])
    write_cache(k_cache, slots, k)
    write_cache(v_cache, slots, v)
    out = q.new_empty(q.shape[0], h * d)
    for seq in sequences:
        ctx = seq.start_pos + seq.count
        keys = read_cache(k_cache, seq.slots[None], q.dtype)[0]  # [KVH, ctx, D]
        values = read_cache(v_cache, seq.slots[None], q.dtype)[0]
        if h != kvh:
            keys, values = keys.repeat_interleave(h // kvh, dim=0), values.repeat_interleave(h // kvh, dim=0)
        query = q[seq.first : seq.first + seq.count].transpose(0, 1)  # [H, n, D]
        scores = torch.matmul(query, keys.transpose(1, 2)) * attention.scaling
        if attention.softcap is not None:
            scores = torch.tanh(scores / attention.softcap) * attention.softcap
        q_pos = torch.arange(seq.start_pos, ctx)[:, None]
        k_pos = torch.arange(ctx)[None, :]
        allowed = k_pos <= q_pos
        if attention.sliding_window is not None:
            allowed &= k_pos > q_pos - attention.sliding_window
        scores = scores.masked_fill(~allowed, float("-inf"))
        if attention.sinks is None:
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        else:
            sink = attention.sinks.to(scores.dtype)[:, None, None].expand(h, seq.count, 1)
            combined = torch.cat((scores, sink), dim=-1)
            combined = combined - combined.max(dim=-1, keepdim=True).values
            probs = torch.softmax(combined, dim=-1, dtype=torch.float32)[..., :-1].to(q.dtype)
        out[seq.first : seq.first + seq.count] = torch.matmul(probs, values).transpose(0, 1).reshape(seq.count, h * d)
    return out
