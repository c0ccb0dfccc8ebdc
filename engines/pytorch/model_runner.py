"""Batched forward pass of a Llama-family decoder over a paged KV cache.

The KV cache is a fixed pool of `num_blocks * block_size` slots per layer. A step takes any mix of prefill
chunks and decodes: the new tokens of every sequence are packed into one flat batch for the dense layers
(projections, MLP, norms -- where the time goes), and attention reads each sequence's keys and values through
its block table. Norms, rotary embeddings, activations and the down/output projections are the transformers
modules themselves and q/k/v and gate/up run as fused copies of the same weights, so greedy output matches
transformers token for token; attention over the paged cache is ours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engines.types import SequenceStep

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class _StepLayout:
    """Index tensors shared by every layer of one step."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T] cache slot each new token is written to
    kv_index: torch.Tensor  # [B, max_ctx] cache slots each sequence attends to
    mask: torch.Tensor  # [B, 1, max_q, max_ctx] True where attention is allowed
    q_index: torch.Tensor  # [T] row of each new token in the padded [B * max_q] query layout
    batch: int
    max_q: int
    sample_rows: torch.Tensor  # [S] rows (in T) whose logits are sampled


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PagedModelRunner:
    def __init__(self, hf_model: Any, num_blocks: int, block_size: int) -> None:
        """Take over `hf_model`'s weights; q/k/v and gate/up projections are fused into one matmul each."""
        config = hf_model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model type '{config.model_type}' is not supported by the native engine "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)}); use backend: vllm for it"
            )
        self.model = hf_model.model
        self.lm_head = hf_model.lm_head
        self.dtype = next(hf_model.parameters()).dtype
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.num_layers = config.num_hidden_layers
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._fused = [self._fuse(layer) for layer in self.model.layers]
        shape = (self.num_layers, num_blocks * block_size, self.num_kv_heads, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype)
        self.v_cache = torch.zeros(shape, dtype=self.dtype)

    @staticmethod
    def _fuse(layer: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """One weight for q/k/v and one for gate/up: fewer, larger matmuls (the same dot products).

        The separate projections are dropped afterwards so the weights are not held twice.
        """
        attn, mlp = layer.self_attn, layer.mlp
        projs = (attn.q_proj, attn.k_proj, attn.v_proj)
        qkv = torch.cat([p.weight for p in projs]).contiguous()
        bias = torch.cat([p.bias for p in projs]).contiguous() if attn.q_proj.bias is not None else None
        if mlp.gate_proj.bias is not None:
            raise ValueError("MLP projections with bias are not supported by the native engine; use backend: vllm")
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).contiguous()
        for name in ("q_proj", "k_proj", "v_proj"):
            delattr(attn, name)
        for name in ("gate_proj", "up_proj"):
            delattr(mlp, name)
        return qkv, bias, gate_up

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.k_cache.element_size()

    def _layout(self, batch: Sequence[SequenceStep]) -> _StepLayout:
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        q_index: list[int] = []
        sample_rows: list[int] = []
        max_q = max(len(s.token_ids) for s in batch)
        max_ctx = max(s.start_pos + len(s.token_ids) for s in batch)
        kv_index = torch.zeros(len(batch), max_ctx, dtype=torch.long)
        q_pos = torch.full((len(batch), max_q), -1, dtype=torch.long)
        ctx_lens = torch.empty(len(batch), dtype=torch.long)
        for b, seq in enumerate(batch):
            n = len(seq.token_ids)
            ctx = seq.start_pos + n
            table = torch.tensor(seq.block_table[: (ctx + bs - 1) // bs], dtype=torch.long)
            seq_slots = (table[:, None] * bs + torch.arange(bs)).flatten()[:ctx]
            kv_index[b, :ctx] = seq_slots
            ids.extend(seq.token_ids)
            positions.extend(range(seq.start_pos, ctx))
            slots.extend(seq_slots[seq.start_pos :].tolist())
            q_index.extend(range(b * max_q, b * max_q + n))
            q_pos[b, :n] = torch.arange(seq.start_pos, ctx)
            ctx_lens[b] = ctx
            if seq.sample:
                sample_rows.append(len(ids) - 1)
        key_pos = torch.arange(max_ctx)
        # A query at position p sees keys at positions <= p; padded query rows (p = -1) see key 0 only, which
        # keeps softmax finite; their outputs are dropped.
        mask = (key_pos[None, None, :] <= q_pos[:, :, None].clamp(min=0)) & (key_pos[None, None, :] < ctx_lens[:, None, None])
        return _StepLayout(
            input_ids=torch.tensor(ids, dtype=torch.long),
            positions=torch.tensor(positions, dtype=torch.long),
            slots=torch.tensor(slots, dtype=torch.long),
            kv_index=kv_index,
            mask=mask[:, None, :, :],
            q_index=torch.tensor(q_index, dtype=torch.long),
            batch=len(batch),
            max_q=max_q,
            sample_rows=torch.tensor(sample_rows, dtype=torch.long),
        )

    def _attention(self, layer_idx: int, attn: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lay: _StepLayout) -> torch.Tensor:
        t = x.shape[0]
        qkv_weight, qkv_bias, _ = self._fused[layer_idx]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q, k, v = F.linear(x, qkv_weight, qkv_bias).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # qwen3
            q = attn.q_norm(q)
            k = attn.k_norm(k)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k_cache = self.k_cache[layer_idx]
        v_cache = self.v_cache[layer_idx]
        k_cache.index_copy_(0, lay.slots, k)
        v_cache.index_copy_(0, lay.slots, v)
        keys = k_cache[lay.kv_index].transpose(1, 2)  # [B, kvh, ctx, d]
        values = v_cache[lay.kv_index].transpose(1, 2)
        if lay.max_q == 1:  # pure decode: one query per sequence, already in batch order
            q_pad = q.view(lay.batch, 1, self.num_heads, self.head_dim).transpose(1, 2)
        else:
            q_pad = q.new_zeros(lay.batch * lay.max_q, self.num_heads, self.head_dim)
            q_pad[lay.q_index] = q
            q_pad = q_pad.view(lay.batch, lay.max_q, self.num_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q_pad, keys, values, attn_mask=lay.mask, scale=attn.scaling, enable_gqa=self.num_heads != self.num_kv_heads
        )
        out = out.transpose(1, 2).reshape(lay.batch * lay.max_q, self.num_heads * self.head_dim)
        if lay.max_q > 1:
            out = out[lay.q_index]
        return attn.o_proj(out)

    def _mlp(self, layer_idx: int, mlp: Any, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self._fused[layer_idx][2]).chunk(2, dim=-1)
        return mlp.down_proj(mlp.act_fn(gate) * up)

    @torch.inference_mode()
    def forward(self, batch: Sequence[SequenceStep]) -> torch.Tensor:
        """Write the batch's new tokens into the cache; return float32 logits of the rows that sample, [S, V]."""
        lay = self._layout(batch)
        hidden = self.model.embed_tokens(lay.input_ids)  # [T, H]
        cos, sin = self.model.rotary_emb(hidden[None], lay.positions[None])
        cos, sin = cos[0, :, None, :], sin[0, :, None, :]  # [T, 1, d]
        for i, layer in enumerate(self.model.layers):
            residual = hidden
            hidden = residual + self._attention(i, layer.self_attn, layer.input_layernorm(hidden), cos, sin, lay)
            residual = hidden
            hidden = residual + self._mlp(i, layer.mlp, layer.post_attention_layernorm(hidden))
        if lay.sample_rows.numel() == 0:
            return hidden.new_empty(0, self.lm_head.out_features, dtype=torch.float32)
        last = self.model.norm(hidden[lay.sample_rows])
        return self.lm_head(last).float()
