"""Batched forward pass of a decoder (models/: the family's layers, made of layers/) over a paged KV cache.

The KV cache is a fixed pool of `num_blocks * block_size` slots per layer. A step takes any mix of prefill
chunks and decodes: the new tokens of every sequence are packed into one flat batch for the dense layers
(projections, MLP, norms -- where the time goes), decodes first. Attention reads keys and values in place through
the block tables (`PagedAttention`'s C kernels): decode rows (one new token per sequence) and prefill rows (causal
over their sequence's cache). Without the kernels, prefill rows gather their sequences' keys and values and use
`scaled_dot_product_attention` with a causal mask.

The runner owns the cache, the step's layout, the attention over the cache (`_attend`: the C kernels, sliding windows
and soft-capped scores included; without them torch ops, layers/attention.py) and the step replay; the
model's layers see the step through `_Step` (layers/attention.py `StepContext`).

Numerics follow transformers: rotary embeddings, activations and residual adds compute what the transformers
modules compute (bit for bit), q/k/v and gate/up run as fused copies of the same weights. With `fast_kernels` (the
default) the projections run our packed GEMM kernel (linear.py) and attention C kernels (paged_attention.py): they
sum in another order than torch's kernels (but bfloat16 projections on the tile unit, which sum as oneDNN does on
decode-sized calls), so logits differ in the last bits, and greedy output still equals transformers' on the parity
tests (tests/engines/pytorch). RMSNorm is a C kernel too, with torch's order of sums: transformers' bits.
Without them (`fast_kernels=False`, or no C compiler) it is torch ops only: oneDNN with prepacked weights for
float32 projections, SDPA for attention.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engines.interface import StepInputError, UnsupportedModelError
from engines.pytorch import gemm_library, host_memory, kernel_modes, lora, lora_kernel, moe_experts, step_replay
from engines.pytorch import paged_attention as attention_module
from engines.pytorch.dense_ops import DenseOps
from engines.pytorch.exact_forward import ExactForward
from engines.pytorch.gguf_blocks import WeightBlocks
from engines.pytorch.layers.attention import Attention, SequenceRows, attend_torch
from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.layers.projections import Kernels, weight
from engines.pytorch.layers.rotary import Tables
from engines.pytorch.linear import Linear
from engines.pytorch.lora_weights import LoRAWeights
from engines.pytorch.models import build_model, check_supported
from engines.pytorch.native import HelperThreads
from engines.pytorch.paged_attention import (
    DecodeTables,
    PagedAttention,
    PrefillRows,
    cache_slots,
    read_cache,
    rotate,
    write_cache,
)
from engines.pytorch.step_layout import StepLayout, is_decode, order_rows
from engines.pytorch.step_replay import StepReplay
from engines.types import SequenceStep

log = logging.getLogger("switchyard.engines.pytorch")


def _embedding_blocks(blocks: dict[str, WeightBlocks], lm_head: Linear) -> WeightBlocks | None:
    """The embedding table's own GGUF blocks to look rows up in; None where it has none, or where it is tied to the
    lm_head whose kernel reads them (rows then come from the lm_head's panels: the table is held once). No copy: the
    blocks are a view of the saved cache file's mapping, whose pages are read in as their rows are looked up, so the
    table costs resident memory for the rows used (an 8B's untied table is 288 MB; a step reads a row a token)."""
    found = blocks.get("model.embed_tokens")
    if found is None or (found is blocks.get("lm_head") and lm_head.reads_blocks):
        return None
    return found


class _Step:
    """A step as the layers see it (layers/attention.py `StepContext`): its layout and rotary tables, the norms'
    ops and the runner's attention over its KV cache."""

    __slots__ = ("_rows", "_runner", "lay", "num_decode", "tables")

    def __init__(self, runner: PagedModelRunner, lay: StepLayout, tables: Tables) -> None:
        self._runner, self.lay, self.tables, self.num_decode = runner, lay, tables, lay.num_decode
        self._rows: tuple[torch.Tensor, list[SequenceRows]] | None = None

    def norm(self, norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        return self._runner.dense.rms_norm(norm, x)

    def norm_add(self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self._runner.dense.rms_norm_add(norm, x, residual)

    def scale_add(self, x: torch.Tensor, scale: float, residual: torch.Tensor) -> torch.Tensor:
        return self._runner.dense.scale_add(x, scale, residual)

    def head_norm(self, norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        return self._runner.dense.rms_norm_heads(norm, x)

    def attend(self, attention: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._runner._attend(attention, q, k, v, self)

    def sequence_rows(self) -> tuple[torch.Tensor, list[SequenceRows]]:
        """Every row's cache slot and each sequence's rows (for attention in torch ops), made once a step."""
        if self._rows is None:
            bs = self._runner.block_size
            slots, sequences, row = [], [], 0
            for seq in self.lay.steps:
                n = len(seq.token_ids)
                seq_slots = cache_slots(seq.block_table, bs, seq.start_pos + n)
                slots.append(seq_slots[seq.start_pos :])
                sequences.append(SequenceRows(row, n, seq.start_pos, seq_slots))
                row += n
            self._rows = (torch.cat(slots), sequences)
        return self._rows


class PagedModelRunner:
    def __init__(
        self,
        hf_model: Any,
        num_blocks: int,
        block_size: int,
        *,
        fast_kernels: bool = True,
        kernel_cache_dir: Path | None = None,
        gemm_threads: int = 1,
        blocks: dict[str, WeightBlocks] | None = None,
        match_transformers: bool = False,
        packed: Callable[[Iterable[WeightBlocks]], None] | None = None,
        kv_cache_dtype: torch.dtype | None = None,
    ) -> None:
        """Take over `hf_model`'s weights; q/k/v and gate/up projections are fused into one matmul each.
        `blocks`: GGUF blocks of the projections by module path (gguf_weights.read_weights), for the GEMM kernel;
        `packed` is called with each layer's blocks, and then the lm_head's and the embedding's, once the runner
        holds them in its own memory (`GGUFWeights.drop_pages`: the file pages they were read from can go).
        `match_transformers` (bfloat16): steps run in transformers' call shapes, bit for bit (exact_forward.py).
        `kv_cache_dtype`: the KV cache's (default: the model's; bfloat16 under a float32 model halves the cache)."""
        config = hf_model.config
        check_supported(config.model_type, getattr(config, "architectures", None))  # before any work
        self.embed_tokens = hf_model.model.embed_tokens
        # The embedding table is the lm_head's (tied) or its own: from GGUF blocks, rows are dequantized as they are
        # looked up (the float32 values transformers loads, bit for bit: gguf_weights.py checked the whole table
        # against gguf-py), so no float32 copy of it is kept.
        has_embed_blocks = "model.embed_tokens" in (blocks or {})
        self.dtype = next(hf_model.parameters()).dtype
        self.num_layers = config.num_hidden_layers
        self.hidden_size = config.hidden_size
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.vocab_size = hf_model.lm_head.out_features
        self.fast_kernels = fast_kernels
        # Weights loaded from safetensors are views of the file's mapping, which stays resident as long as any of
        # them lives: own copies of the ones kept as they are (the norms copy theirs, layers/norms.py; a tied
        # lm_head shares the embedding's copy), so with packed projections the mapping goes.
        if not has_embed_blocks:
            for param in self.embed_tokens.parameters():
                param.data = param.data.clone()
        # helper threads for the C kernels (projections, attention, norms); they only run inside them
        self._helpers = None
        if fast_kernels and gemm_threads > 1:
            try:
                self._helpers = HelperThreads(gemm_threads - 1, kernel_cache_dir)
            except OSError as exc:
                log.warning("native engine: no helper threads (%s); steps run on one thread", exc)
        self.dense = DenseOps(fast_kernels, self.dtype, kernel_cache_dir, self._helpers)
        packed = packed or (lambda _: None)
        kernels = Kernels(fast_kernels, kernel_cache_dir, self._helpers, self.dense)
        self.model = build_model(hf_model, blocks, kernels, packed)  # models/: the family's layers
        self.layers, self.norm = self.model.layers, self.model.norm
        first = self.layers[0].attn
        self.num_heads, self.num_kv_heads, self.head_dim = first.num_heads, first.num_kv_heads, first.head_dim
        if match_transformers and self.dtype != torch.bfloat16:
            raise ValueError("match_transformers is for dtype bfloat16 (float32 already answers as transformers does)")
        if match_transformers and not self.model.llama_shaped:
            raise UnsupportedModelError(
                f"pytorch.match_transformers runs Llama-shaped models with plain causal attention (llama, qwen2, "
                f"qwen3, mistral without a sliding window), not {config.model_type}; leave it off for this model"
            )
        self._exact = ExactForward(hf_model) if match_transformers else None
        lm_head = hf_model.lm_head
        self.lm_head = Linear(
            weight(lm_head), lm_head.bias, fast_kernels, kernel_cache_dir, self._helpers, (blocks or {}).get("lm_head")
        )
        del hf_model.model.layers, hf_model.lm_head  # the runner holds the (fused, maybe packed) weights now
        self._embed_blocks = _embedding_blocks(blocks or {}, self.lm_head)
        self._embed_from_head = has_embed_blocks and self._embed_blocks is None
        packed(b for path, b in (blocks or {}).items() if path in ("lm_head", "model.embed_tokens"))
        if has_embed_blocks:  # the float32 table goes with the model
            self.embed_tokens = hf_model.model.embed_tokens = None
        kv_dtype = kv_cache_dtype or self.dtype
        if (self.dtype, kv_dtype) not in attention_module.SUFFIXES and kv_dtype != self.dtype:
            raise ValueError(f"a {str(kv_dtype).removeprefix('torch.')} KV cache is for float32 models")
        shape = (self.num_layers, num_blocks * block_size, self.num_kv_heads, self.head_dim)
        self.k_cache = host_memory.zeros(shape, kv_dtype)
        self.v_cache = host_memory.zeros(shape, kv_dtype)
        self.attention = PagedAttention(
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            block_size,
            self.dtype,
            kernel_cache_dir,
            use_kernel=fast_kernels,
            helpers=self._helpers,
            cache_dtype=kv_dtype,
        )
        self._replay = self._step_replay(kernel_cache_dir) if fast_kernels and not match_transformers else None
        self.adapters: dict[int, LoRAWeights] = {}  # LoRA adapters by id (lora.py)
        self._kernel_cache_dir = kernel_cache_dir
        self._lora_slots: lora_kernel.Slots | None = None  # with the LoRA C kernel: the adapters' slots
        self._lora_generation = 0  # the slot tables' generation the plans with adapter rows were recorded with
        log.info(
            "native engine: projections: %s (%d threads), attention: %s",
            self.lm_head.kind,
            gemm_threads if self._helpers else 1,
            "C kernels" if self.attention.uses_kernel else "torch",
        )

    def _step_replay(self, cache_dir: Path | None) -> StepReplay | None:
        """Decode steps in one C call (step_replay.py), where the projections and the attention are C kernels."""
        gemm, attention = gemm_library._lib, self.attention._lib
        if not step_replay.ENABLED or gemm is None or attention is None or self.lm_head.kind != "kernel":
            return None
        projections = [self.lm_head, *self.model.projections()]
        holders = [*projections, *(p._linear for p in projections if getattr(p, "_linear", None) is not None)]
        libs, signatures = [gemm, attention], [gemm_library._SIGNATURES, attention_module._SIGNATURES]
        fused = [f for f in (getattr(layer.mlp, "fused", None) for layer in self.model.layers) if f is not None]
        if fused:  # MoE blocks in one C call each (moe_experts.py): recorded like the projections
            libs.append(fused[0].library)
            signatures.append(moe_experts.SIGNATURES)
        replay = StepReplay(
            cache_dir,
            libs,
            signatures,
            holders,
            [getattr(attention, f"paged_decode_{s}") for s in attention_module.SUFFIXES.values()],
            [self],
        )
        return replay if replay.enabled else None

    def add_adapter(self, adapter_id: int, weights: LoRAWeights) -> None:
        """Serve rows of `adapter_id` with `weights` from the next step on (lora.py; any thread)."""
        if self._exact is not None:
            raise UnsupportedModelError(
                "LoRA adapters are not applied with pytorch.match_transformers; turn it off to serve adapters"
            )
        if self._lora_slots is None and self.fast_kernels and self.dtype == torch.float32:
            lib = lora_kernel.library(self._kernel_cache_dir, self._helpers)
            if lib is not None and self._replay is not None:  # decode steps with adapter rows replay too
                self._replay.add_library(lib, lora_kernel.SIGNATURES, lora_kernel.STEP_ARGS)
            self._lora_slots = lora_kernel.Slots(lib) if lib is not None else None
        slots = self._lora_slots
        # before the adapter is visible: a step that sees it has the wrapped projections and the adapter's slot
        lora.install(self.model, slots)
        lora.prepare(self.model, weights, kernel=slots is not None)
        if slots is not None:
            slots.add(adapter_id, weights, lora.wrapped(self.model))
        self.adapters[adapter_id] = weights

    def remove_adapter(self, adapter_id: int) -> None:
        if self.adapters.pop(adapter_id, None) is not None and self._lora_slots is not None:
            self._lora_slots.release(adapter_id)

    def _adapter_groups(self, lay: StepLayout) -> lora.StepAdapters | None:
        """The step's rows by the adapter they run under (lora.py), and with the C kernel each row's slot; None where
        every row is the base model's."""
        slots = self._lora_slots
        if slots is not None:
            if slots.generation != self._lora_generation and self._replay is not None:
                self._replay.drop(adapters=True)  # the slot tables grew: the plans with adapter rows point to the old
            self._lora_generation = slots.generation
            slots.recycle(lora.wrapped(self.model))  # no step reads the slots of adapters removed before this one
        if not self.adapters:
            return None
        adapters = dict(self.adapters)  # this step's: another thread may add or remove one meanwhile
        spans: dict[int, list[tuple[int, int]]] = {}
        row_slots: list[int] = []
        row = 0
        for seq in lay.steps:
            n = len(seq.token_ids)
            if seq.adapter_id:
                if seq.adapter_id not in adapters:
                    raise StepInputError(f"LoRA adapter {seq.adapter_id} of {seq.seq_id} is not loaded")
                spans.setdefault(seq.adapter_id, []).append((row, row + n))
            if slots is not None:
                row_slots += [slots.of(seq.adapter_id) if seq.adapter_id else -1] * n
            row += n
        if not spans:
            return None
        step = lora.StepAdapters(lora.row_groups(spans, adapters))
        if slots is not None:
            step.slots, step.lib = torch.tensor(row_slots, dtype=torch.int32), slots.lib
        return step

    @property
    def kernel_threads(self) -> int:
        """Threads our C kernels run a step's projections on (the step's thread and its helpers); 0 when the
        projections are torch's (no compiler, fast_kernels off), whose intra-op threads then do the work."""
        if self.lm_head.kind != "kernel":
            return 0
        return 1 + (self._helpers.count if self._helpers is not None else 0)

    @property
    def tile_unit_decode_rows(self) -> int:
        """Decode rows past which a step's projections run them on the tile unit (kernel_modes.TILE_UNIT_MIN_ROWS), with
        other bits than fewer rows get; 0 when no projection reads GGUF blocks on a tile unit."""
        projections = [self.lm_head, *self.model.projections()]
        return kernel_modes.TILE_UNIT_MIN_ROWS if any(p.on_tile_unit for p in projections) else 0

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.k_cache.element_size()

    # ------------------------------------------------------------------ step layout

    def _layout(self, batch: Sequence[SequenceStep]) -> StepLayout:
        """`order_rows` plus what the attention reads for the decode rows and the prefill rows."""
        bs = self.block_size
        lay = order_rows(batch)
        decodes = [s for s in lay.steps if is_decode(s)]
        prefills = lay.steps[len(decodes) :]
        if decodes:  # a verification step's rows: one decode row per position, each over the cache up to it (the
            # decode kernel writes every row's key and value before any row attends)
            rows = [(s, s.start_pos + j) for s in decodes for j in range(len(s.token_ids))]
            lay.decode = DecodeTables(
                [s.block_table[: p // bs + 1] for s, p in rows], [p + 1 for _, p in rows], bs, self.num_blocks
            )
        if prefills:
            self._prefill_layout(prefills, lay)
        return lay

    def _prefill_layout(self, batch: list[SequenceStep], lay: StepLayout) -> None:
        bs = self.block_size
        if self.attention.uses_kernel:
            tables = [s.block_table[: (s.start_pos + len(s.token_ids) + bs - 1) // bs] for s in batch]
            lay.prefill = PrefillRows(
                tables, [s.start_pos for s in batch], [len(s.token_ids) for s in batch], bs, self.num_blocks
            )
            return
        slots: list[int] = []
        q_index: list[int] = []
        max_q = max(len(s.token_ids) for s in batch)
        max_ctx = max(s.start_pos + len(s.token_ids) for s in batch)
        kv_index = torch.zeros(len(batch), max_ctx, dtype=torch.long)
        q_pos = torch.full((len(batch), max_q), -1, dtype=torch.long)
        ctx_lens = torch.empty(len(batch), dtype=torch.long)
        for b, seq in enumerate(batch):
            n = len(seq.token_ids)
            ctx = seq.start_pos + n
            seq_slots = cache_slots(seq.block_table, bs, ctx)
            kv_index[b, :ctx] = seq_slots
            slots.extend(seq_slots[seq.start_pos :].tolist())
            q_index.extend(range(b * max_q, b * max_q + n))
            q_pos[b, :n] = torch.arange(seq.start_pos, ctx)
            ctx_lens[b] = ctx
        key_pos = torch.arange(max_ctx)
        # A query at position p sees keys at positions <= p; padded query rows (p = -1) see key 0 only, which
        # keeps softmax finite; their outputs are dropped.
        mask = (key_pos[None, None, :] <= q_pos[:, :, None].clamp(min=0)) & (
            key_pos[None, None, :] < ctx_lens[:, None, None]
        )
        lay.slots = torch.tensor(slots, dtype=torch.long)
        lay.kv_index = kv_index
        lay.mask = mask[:, None, :, :]
        lay.q_index = torch.tensor(q_index, dtype=torch.long)
        lay.batch = len(batch)
        lay.max_q = max_q

    # ------------------------------------------------------------------ forward

    def _prefill_attention(
        self,
        attention: Attention,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        lay: StepLayout,
    ) -> torch.Tensor:
        h, kvh, d, scale = self.num_heads, self.num_kv_heads, self.head_dim, attention.scaling
        k_cache, v_cache = self.k_cache[attention.layer_idx], self.v_cache[attention.layer_idx]
        if lay.prefill is not None:  # the kernel rotates q and k and writes k and v itself
            return self.attention.prefill(
                q,
                k,
                v,
                cos,
                sin,
                k_cache,
                v_cache,
                lay.prefill,
                scale,
                attention.sliding_window,
                attention.softcap,
                attention.sinks,
            )
        q, k = rotate(q, cos[:, None], sin[:, None]), rotate(k, cos[:, None], sin[:, None])
        write_cache(k_cache, lay.slots, k)
        write_cache(v_cache, lay.slots, v)
        keys, values = read_cache(k_cache, lay.kv_index, q.dtype), read_cache(v_cache, lay.kv_index, q.dtype)
        q_pad = q.new_zeros(lay.batch * lay.max_q, h, d)
        q_pad[lay.q_index] = q
        q_pad = q_pad.view(lay.batch, lay.max_q, h, d).transpose(1, 2)
        out = F.scaled_dot_product_attention(q_pad, keys, values, attn_mask=lay.mask, scale=scale, enable_gqa=h != kvh)
        return out.transpose(1, 2).reshape(lay.batch * lay.max_q, h * d)[lay.q_index]

    def _attend(
        self, attention: Attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: _Step
    ) -> torch.Tensor:
        """A layer's attention of the step's rows (StepContext.attend): plain causal attention on the paged kernels
        (decode rows, then prefill rows), a sliding window, soft-capped scores and attention sinks (gpt-oss)
        included; without the kernels, those three in torch ops (attend_torch)."""
        i, lay = attention.layer_idx, step.lay
        cos, sin = step.tables[attention.rope]
        if not attention.plain and not self.attention.uses_kernel:
            slots, sequences = step.sequence_rows()
            return attend_torch(attention, q, k, v, cos, sin, self.k_cache[i], self.v_cache[i], slots, sequences)
        t, nd = q.shape[0], lay.num_decode
        parts = []
        if nd:  # the decode kernel rotates q and k itself
            parts.append(
                self.attention.decode(
                    q[:nd],
                    k[:nd],
                    v[:nd],
                    cos[:nd],
                    sin[:nd],
                    self.k_cache[i],
                    self.v_cache[i],
                    lay.decode,
                    attention.scaling,
                    attention.sliding_window,
                    attention.softcap,
                    attention.sinks,
                )
            )
        if nd < t:
            parts.append(self._prefill_attention(attention, q[nd:], k[nd:], v[nd:], cos[nd:], sin[nd:], lay))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _embed(self, lay: StepLayout) -> tuple[torch.Tensor, Tables]:
        """The step's embeddings [T, H] (scaled as the family scales them) and its rotary tables."""
        if self._embed_blocks is not None:
            hidden = self._embed_blocks.rows(lay.input_ids).dequantize()
        elif self._embed_from_head:
            hidden = self.lm_head.weight_rows(lay.input_ids)
        else:
            hidden = F.embedding(lay.input_ids, self.embed_tokens.weight)
        if self.model.embed_scale is not None:
            hidden = self.model.embed_scale(hidden)
        return hidden, self.model.rotary(hidden, lay)

    def embed(self, lay: StepLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's embeddings [T, H] and rotary cos and sin [T, d] (sin's sign folded: see rotate) of a model
        with one rotary table."""
        hidden, tables = self._embed(lay)
        cos, sin = tables[None]
        return hidden, cos, sin

    def forward(self, batch: Sequence[SequenceStep]) -> torch.Tensor:
        """Write the batch's new tokens into the cache; return float32 logits of the rows that sample, [S, V], in
        row order (step_layout.row_order: the decode and verification steps first)."""
        return self.forward_greedy(batch, greedy=False)[0]

    @torch.inference_mode()
    def forward_greedy(
        self, batch: Sequence[SequenceStep], greedy: bool = True
    ) -> tuple[torch.Tensor, list[int] | None]:
        """`forward`, and with `greedy` each sampling row's argmax where the step computed it on the way (a replayed
        decode step whose logits are all finite; else None: the caller samples the logits)."""
        helpers = self._helpers
        if helpers is not None:
            helpers.enter()
        if self._exact is not None:
            return self._exact.forward(self, batch), None
        lay = self._layout(batch)
        groups = self._adapter_groups(lay)
        hidden, tables = self._embed(lay)
        with lora.step_groups(groups):
            if helpers is None:
                return self._layers(lay, hidden, tables, greedy, groups)
            helpers.wake()  # the kernels follow: helpers spin between them, then sleep until the next step
            try:
                return self._layers(lay, hidden, tables, greedy, groups)
            finally:
                helpers.rest()

    def _layers(
        self,
        lay: StepLayout,
        hidden: torch.Tensor,
        tables: Tables,
        greedy: bool,
        adapters: lora.StepAdapters | None = None,
    ) -> tuple[torch.Tensor, list[int] | None]:
        """The layers and logits of a step's embeddings: replayed in one C call where the step allows (and then
        with the greedy tokens when asked), else from Python. A model whose layers run torch ops between the
        kernels (a bfloat16 model's Gemma norms or Granite multipliers) records no plan (step_replay.py refuses
        it). A step with LoRA adapter rows (`adapters`) has plans of its own, each row's slot a per-step input,
        where the updates are the C kernel's (lora_kernel.py); on the torch path it runs from Python and neither
        records nor replays."""

        def dense(h: torch.Tensor) -> torch.Tensor:
            return self._dense(h, tables, lay)

        kernel_updates = adapters is None or adapters.slots is not None
        if self._replay is None or not kernel_updates or not self._replayable(lay):
            return dense(hidden), None
        rows, with_adapters = lay.num_decode, adapters is not None
        inputs = {"tables": lay.decode.tables, "ctx_lens": lay.decode.ctx_lens}
        if adapters is not None and adapters.slots is not None:
            inputs["lora_slots"] = adapters.slots
        for kind, (cos, sin) in tables.items():  # one rotary table, or one a layer type (Gemma 3)
            suffix = "" if len(tables) == 1 else f":{kind}"
            inputs[f"cos{suffix}"], inputs[f"sin{suffix}"] = cos, sin
        max_blocks = lay.decode.tables.shape[1]
        state = self._replay.plan_state(rows, with_adapters)
        if state == "replayed":
            return self._replay.run(rows, hidden, inputs, max_blocks, greedy, with_adapters)
        if state == "none":
            return self._replay.record(rows, dense, hidden, inputs, with_adapters), None
        if state == "recorded":
            return self._replay.validate(rows, dense, hidden, inputs, max_blocks, with_adapters), None
        return dense(hidden), None

    def _replayable(self, lay: StepLayout) -> bool:
        """A step of decode rows only (one-token decodes and verification steps' k + 1 rows), every row sampling in
        order: the same kernel calls for every step of that many rows, whichever sequences the rows belong to."""
        return lay.decode is not None and lay.num_decode == lay.input_ids.numel() and lay.sample_rows is None

    def _dense(self, hidden: torch.Tensor, tables: Tables, lay: StepLayout) -> torch.Tensor:
        """The layers and the logits of a step's embeddings."""
        step = _Step(self, lay, tables)
        for layer in self.layers:
            hidden = layer(hidden, step)
        return self.logits(hidden, lay)

    def logits(
        self, hidden: torch.Tensor, lay: StepLayout, head: Callable[[torch.Tensor], torch.Tensor] | None = None
    ) -> torch.Tensor:
        """float32 logits [S, V] of the rows that sample, in row order, from the last layer's output (`head`:
        instead of lm_head). The decode rows come first, so the lm_head computes them as one-token steps do and
        the prompts' last rows after them (`Linear`'s `prompt_from`)."""
        rows = lay.sample_rows
        if rows is not None and rows.numel() == 0:
            return hidden.new_empty(0, self.vocab_size, dtype=torch.float32)
        x = self.dense.rms_norm(self.norm, hidden if rows is None else hidden[rows])
        if head is not None:
            logits = head(x)
        else:
            decode = lay.num_decode if rows is None else int((rows < lay.num_decode).sum())
            logits = self.lm_head(x, prompt_from=decode)
        if self.model.final_softcap is not None:
            logits = self.dense.softcap(logits, self.model.final_softcap)
        if self.model.logits_divisor is not None:
            logits = self.dense.divide(logits, self.model.logits_divisor)
        return logits.float()
