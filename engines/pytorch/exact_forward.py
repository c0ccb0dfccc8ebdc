"""The bfloat16 forward pass in transformers' own call shapes: `pytorch.match_transformers`, bit for bit.

In bfloat16 torch gives a row bits that depend on the call computing it: oneDNN sums K in pieces on calls of more
than 32 rows (and in one on smaller ones), and SDPA's flash kernel blocks by the numbers of queries and keys
(docs/native-engine.md). transformers' `generate` makes two kinds of call per sequence, and this forward makes the
same ones:

* **prompt rows**, per sequence: the whole prompt through `F.linear` with the model's own q, k, v, o, gate, up and
  down weights, and transformers' SDPA attention (`sdpa_attention_forward`, causal) over the prompt;
* **one-row rows** (decodes, and generated tokens recomputed after a preemption): the projections on the tile unit,
  whose bits are oneDNN's for calls of up to 32 rows (one `F.linear` call per row where the tile unit is not in
  use), and per row transformers' SDPA attention of the one query over its sequence's keys, read from the cache.

RMSNorm and SiLU-and-multiply are per-row kernels with torch's bits; embeddings, rotary embeddings and residual adds
are the same ops as transformers'. Prompts must arrive whole and their keys must not come from another sequence:
the config refuses chunked prefill and prefix caching with this mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol

import torch

from engines.pytorch.linear import Linear
from engines.pytorch.paged_attention import cache_slots, rotate
from engines.pytorch.step_layout import StepLayout, order_rows
from engines.types import SequenceStep


class Runner(Protocol):
    """What this forward reads of the runner (model_runner.PagedModelRunner): its layers and KV cache, and the
    embeddings and logits tail it shares with the runner's own forward. A protocol, so this module needs no import of
    the runner, which imports it."""

    block_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layers: list[Any]
    k_cache: torch.Tensor  # [layers, ...]
    v_cache: torch.Tensor
    dense: Any
    lm_head: Linear

    def embed(self, lay: StepLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def logits(
        self, hidden: torch.Tensor, lay: StepLayout, head: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> torch.Tensor: ...


@dataclass
class _Weights:
    """One layer's projections as transformers holds them (for the prompt rows' calls)."""

    q: torch.nn.Linear
    k: torch.nn.Linear
    v: torch.nn.Linear
    o: torch.nn.Linear
    gate: torch.nn.Linear
    up: torch.nn.Linear
    down: torch.nn.Linear
    act: torch.nn.Module
    attention: Any  # what transformers' attention function reads of the module


@dataclass
class _Rows:
    """Where each row of a step goes: one-row rows (in step order) and each prompt's rows, plus every row's cache
    slot and, for the one-row rows, the cache slots of the keys they attend to."""

    one_row: torch.Tensor  # [R] step rows computed one row per call
    prompts: list[tuple[int, int]]  # (first row, rows) of each whole prompt
    slots: torch.Tensor  # [T] cache slot of each row's key and value
    context: list[torch.Tensor]  # per one-row row: the cache slots of positions 0..its own


class ExactForward:
    """Takes the plain projection weights from the HF model before the runner packs them (they stay as they are:
    about 2 bytes per parameter more than the packed copies)."""

    def __init__(self, hf_model: Any) -> None:
        self._lm_head = hf_model.lm_head  # a tied head shares the embedding's weight
        self._layers = []
        for layer in hf_model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            module = SimpleNamespace(
                num_key_value_groups=attn.num_key_value_groups, is_causal=True, layer_idx=attn.layer_idx
            )
            self._layers.append(
                _Weights(
                    attn.q_proj,
                    attn.k_proj,
                    attn.v_proj,
                    attn.o_proj,
                    mlp.gate_proj,
                    mlp.up_proj,
                    mlp.down_proj,
                    mlp.act_fn,
                    module,
                )
            )

    @staticmethod
    def _rows(steps: list[SequenceStep], block_size: int) -> _Rows:
        one_row: list[int] = []
        prompts: list[tuple[int, int]] = []
        slots: list[int] = []
        context: list[torch.Tensor] = []
        row = 0
        for seq in steps:
            end = seq.start_pos + len(seq.token_ids)
            seq_slots = cache_slots(seq.block_table, block_size, end)
            slots.extend(seq_slots[seq.start_pos :].tolist())
            prompt = max(0, min(seq.num_prompt_tokens, end) - seq.start_pos)
            if prompt and (seq.start_pos != 0 or prompt != seq.num_prompt_tokens):
                raise ValueError("match_transformers needs whole prompts: disable chunked prefill and prefix caching")
            if prompt:
                prompts.append((row, prompt))
            for pos in range(seq.start_pos + prompt, end):
                one_row.append(row + pos - seq.start_pos)
                context.append(seq_slots[: pos + 1])
            row += len(seq.token_ids)
        return _Rows(torch.tensor(one_row, dtype=torch.long), prompts, torch.tensor(slots, dtype=torch.long), context)

    @staticmethod
    def _one_rows(linear: Linear, plain: Any, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """`plain(x) (+ residual)` with one-row calls' bits: the tile kernel, else one F.linear call per row."""
        if linear.exact_rows:
            return linear(x, residual)
        y = _per_row(plain, x)
        return y if residual is None else residual + y

    @torch.inference_mode()
    def forward(self, runner: Runner, batch: Sequence[SequenceStep]) -> torch.Tensor:
        """The runner's `forward` (same contract), in transformers' call shapes."""
        lay = order_rows(batch)  # the rows in the runner's order; its attention tables are not needed
        rows = self._rows(lay.steps, runner.block_size)
        hidden, cos, sin = runner.embed(lay)
        cos, sin = cos[:, None], sin[:, None]
        for i, (layer, w) in enumerate(zip(runner.layers, self._layers, strict=True)):
            hidden = self._layer(runner, i, layer, w, rows, hidden, cos, sin)
        # logits of one row each, as generate computes them: the tile kernel, else one call per row
        return runner.logits(hidden, lay, None if runner.lm_head.exact_rows else lambda x: _per_row(self._lm_head, x))

    def _layer(
        self,
        runner: Runner,
        i: int,
        layer: Any,
        w: _Weights,
        rows: _Rows,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        h, kvh, d = runner.num_heads, runner.num_kv_heads, runner.head_dim
        attn = layer.attn
        x = runner.dense.rms_norm(layer.input_norm, hidden)
        qkv = _assemble(
            rows,
            x,
            (h + 2 * kvh) * d,
            lambda sel: self._one_rows(attn.qkv, _Cat(w.q, w.k, w.v), x[sel]),
            lambda part: torch.cat((w.q(x[part]), w.k(x[part]), w.v(x[part])), dim=-1),
        )
        q = qkv[:, : h * d].view(-1, h, d)
        k = qkv[:, h * d : (h + kvh) * d].view(-1, kvh, d)
        v = qkv[:, (h + kvh) * d :].view(-1, kvh, d)
        if attn.q_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k_cache, v_cache = runner.k_cache[i], runner.v_cache[i]
        k_cache.index_copy_(0, rows.slots, k)
        v_cache.index_copy_(0, rows.slots, v)
        out = x.new_empty(x.shape[0], h * d)
        for first, n in rows.prompts:  # generate's prefill: [1, heads, n, d], causal
            keys = k[first : first + n].transpose(0, 1)[None].contiguous()
            values = v[first : first + n].transpose(0, 1)[None].contiguous()
            query = q[first : first + n][None].transpose(1, 2)
            att, _ = sdpa_attention_forward(w.attention, query, keys, values, None, scaling=attn.scaling)
            out[first : first + n] = att.reshape(n, h * d)
        for r, ctx in zip(rows.one_row.tolist(), rows.context, strict=True):  # generate's decode: one query
            keys = k_cache.index_select(0, ctx).transpose(0, 1)[None].contiguous()
            values = v_cache.index_select(0, ctx).transpose(0, 1)[None].contiguous()
            att, _ = sdpa_attention_forward(
                w.attention, q[r : r + 1][None].transpose(1, 2), keys, values, None, scaling=attn.scaling
            )
            out[r] = att.reshape(h * d)
        hidden = _assemble(
            rows,
            hidden,
            hidden.shape[1],
            lambda sel: self._one_rows(attn.o, w.o, out[sel], hidden[sel]),
            lambda part: hidden[part] + w.o(out[part]),
        )
        x = runner.dense.rms_norm(layer.post_norm, hidden)
        return _assemble(
            rows,
            hidden,
            hidden.shape[1],
            lambda sel: self._one_rows(layer.mlp.down, w.down, self._act_mul(layer, w, x[sel]), hidden[sel]),
            lambda part: hidden[part] + w.down(w.act(w.gate(x[part])) * w.up(x[part])),
        )

    @staticmethod
    def _act_mul(layer: Any, w: _Weights, x: torch.Tensor) -> torch.Tensor:
        """act(gate) * up of one-row rows: the fused projection on the tile unit, else per row in torch."""
        if layer.mlp.gate_up_act.exact_rows:
            return layer.mlp.gate_up_act(x)
        return _per_row(lambda row: w.act(w.gate(row)) * w.up(row), x)


def _per_row(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """`fn` called on each row of x alone (a one-row call's bits), the results stacked."""
    return torch.cat([fn(x[r : r + 1]) for r in range(x.shape[0])]) if x.shape[0] else fn(x)


def _assemble(
    rows: _Rows,
    like: torch.Tensor,
    width: int,
    one_row: Callable[[slice | torch.Tensor], torch.Tensor],
    prompt: Callable[[slice], torch.Tensor],
) -> torch.Tensor:
    """A [rows, width] result: the one-row rows from one batched `one_row` call (given their index, or every row in
    a step without prompts), each prompt's rows from its own `prompt` call (given its slice)."""
    if not rows.prompts:
        return one_row(slice(None))
    out = like.new_empty(like.shape[0], width)
    if rows.one_row.numel():
        out[rows.one_row] = one_row(rows.one_row)
    for first, n in rows.prompts:
        part = slice(first, first + n)
        out[part] = prompt(part)
    return out


class _Cat:
    """q, k and v projections as one callable (one-row calls, where the tile unit is not in use)."""

    def __init__(self, *parts: torch.nn.Linear) -> None:
        self._parts = parts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self._parts], dim=-1)
