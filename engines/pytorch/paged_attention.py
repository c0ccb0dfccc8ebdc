"""Attention that reads the paged KV cache in place: small C kernels, built on first use, with a torch fallback.

A decode step has one new query per sequence. Done with torch ops it needs each layer to copy every sequence's
keys and values out of the paged cache into a dense tensor (a gather of B x context rows, twice) before
`scaled_dot_product_attention`, whose CPU kernel is also slow for one query row. Both cost more than the
projections at batch 32. The decode kernel rotates the step's new query and key (rope), writes the key and value
rows into their cache slots and then, for each sequence and each span of 128 positions of its context, scores every
query head against the span's cached keys (found through the block table), takes a partial softmax and sums the
values, with no copy; a sequence's spans are merged in order. The spans are what threads share, so one sequence with
a long context keeps them all busy, and a row's bits depend only on its own context.

Prefill rows (a chunk of new queries per sequence) are rotated and their keys and values written first (every row
may read keys another row wrote), then each row attends causally to its sequence's cached positions up to its
own. On AVX-512 tiles of 16 consecutive rows of a sequence go through the cache together, one KV head at a time, in
one pass (online softmax): the query rows of a head are the lanes of the registers, so a key's scores against 16
of them are one FMA chain per lane (no horizontal sums) and the softmax runs in the lanes too: 1.7-2.3x faster than
the four-row tiles with a dot product per score it replaced (16 prompts of 128 rows: 1.85x; one 2048-token prompt:
2.2x). In bfloat16 the softmax weights are rounded to bfloat16 before they weigh the values, as torch's flash
attention does (greedy parity with transformers: 8 of 12 prompts with it, 7 without).
Each row's arithmetic does not depend on its tile or chunk (tested).

The kernels are C (`csrc/paged_attention.c`), built by `native.py`. Without a compiler, or if the build fails,
`PagedAttention` falls back to a torch gather + SDPA path with the same results up to float rounding.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from engines.interface import StepInputError
from engines.pytorch.native import HelperThreads, Signatures, load_library

SHARE_MIN_ROWS = 4  # fewer prefill rows are not worth waking a helper thread for (decode rows are shared in spans
# of their context whatever their number)


# (activations' dtype, cache's dtype) -> the suffix of the kernels for them
SUFFIXES = {
    (torch.float32, torch.float32): "f32",
    (torch.bfloat16, torch.bfloat16): "bf16",
    (torch.float32, torch.bfloat16): "f32_kvbf16",
}


def _signatures() -> Signatures:
    """csrc/paged_attention.c's entry points, one set per pair of types (activations, cache): SUFFIXES."""
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    f32 = ctypes.c_float
    # + window, cap, sinks
    decode = [p, i64, p, i64, p, i64, p, p, p, p, p, i32, p, p, i32, i32, i32, i32, i32, f32, i32, f32, p]
    prefill = [p, i64, p, i64, p, i64, p, p, p, p, p, i32, p, p, p, i32, i32, i32, i32, i32, f32, i32, f32, p, i32, i32]
    table: Signatures = {"set_pool": (None, [p])}
    for sfx in SUFFIXES.values():
        table[f"paged_decode_{sfx}"] = (i32, [*decode, i32])  # + share
        table[f"paged_prefill_run_{sfx}"] = (i32, prefill)  # + share
    return table


_SIGNATURES = _signatures()


def _load(cache_dir: Path | None) -> ctypes.CDLL | None:
    return load_library("paged_attention", cache_dir, _SIGNATURES)


class PagedAttention:
    """Attention over the paged cache: `decode` (one new query per sequence, its key and value written first) and
    `prefill` (a chunk of new queries per sequence, causal)."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype,
        cache_dir: Path | None,
        use_kernel: bool = True,
        helpers: HelperThreads | None = None,
        cache_dtype: torch.dtype | None = None,
    ) -> None:
        """`helpers`: threads that share the kernels' work (decode rows' spans of context, prefill rows).
        `cache_dtype`: the KV cache's (default `dtype`; bfloat16 under float32 halves the cache, each key and value
        rounded once as it is written)."""
        self.num_heads, self.num_kv_heads, self.head_dim, self.block_size = (
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
        )
        self._sfx = SUFFIXES.get((dtype, cache_dtype or dtype))
        fits = num_heads % num_kv_heads == 0 and self._sfx is not None
        self._lib = _load(cache_dir) if use_kernel and fits else None
        self._share = helpers is not None and self._lib is not None
        if self._share:
            helpers.attach(self._lib)

    @property
    def uses_kernel(self) -> bool:
        return self._lib is not None

    def decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        step: DecodeTables,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rotate q [B, H, D] and k [B, KVH, D] (rows may be strided views) by cos/sin [B, D] (`sin` with
        rotate_half's sign folded in, see `rotate`), write k and v [B, KVH, D] to their cache slots and attend.
        Caches: [slots, KVH, D]. `window`: a query at p sees keys at p - window < position <= p (transformers'
        sliding window); `softcap`: scores -> tanh(scores / cap) * cap (Gemma 2); `sinks`: [H] contiguous float32 logits
        that join each head's softmax denominator with no value (gpt-oss; kept alive by the caller: a replayed step
        reads it again). Returns [B, H * D]."""
        b, h, d = q.shape
        special = window is not None or softcap is not None or sinks is not None
        if self._lib is not None and special:  # no torch fallback computes these: the kernel's layout
            q, k, v = (x if x.stride(2) == 1 and x.stride(1) == d else x.contiguous() for x in (q, k, v))
            cos, sin = cos.contiguous(), sin.contiguous()
        if (
            self._lib is not None
            and all(x.stride(2) == 1 and x.stride(1) == d for x in (q, k, v))
            and cos.is_contiguous()
            and sin.is_contiguous()
            and cos.shape == (b, d)
        ):
            out = q.new_empty(b, h * d)
            args = (
                q.data_ptr(),
                q.stride(0),
                k.data_ptr(),
                k.stride(0),
                v.data_ptr(),
                v.stride(0),
                cos.data_ptr(),
                sin.data_ptr(),
                k_cache.data_ptr(),
                v_cache.data_ptr(),
                step.tables.data_ptr(),
                step.tables.shape[1],
                step.ctx_lens.data_ptr(),
                out.data_ptr(),
                b,
                h,
                self.num_kv_heads,
                d,
                self.block_size,
                scale,
                window or 0,
                softcap or 0.0,
                _sinks_ptr(sinks, h),
                int(self._share),
            )
            rc = getattr(self._lib, f"paged_decode_{self._sfx}")(*args)
            if rc != 0:
                raise MemoryError("paged attention kernel could not allocate its score buffer")
            return out
        if special:
            raise RuntimeError("a sliding window, soft-capped scores or attention sinks need the C kernel")
        return self._torch(
            rotate(q, cos[:, None], sin[:, None]),
            rotate(k, cos[:, None], sin[:, None]),
            v,
            k_cache,
            v_cache,
            step,
            scale,
        )

    def prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        rows: PrefillRows,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A prefill chunk: rotate q [R, H, D] and k [R, KVH, D] by cos/sin [R, D] (as `decode`; None when they
        are rotated already), write k and v to their cache slots, then causal attention of every row over its
        sequence's cache (within `window`, scores soft-capped by `softcap`, with `sinks`, as `decode`): [R, H * D].
        Needs the kernel (`uses_kernel`); without it the runner gathers and uses SDPA (plain layers) or
        attend_torch."""
        if self._lib is None:
            raise RuntimeError("prefill attention needs the C kernel")
        r, h, d = q.shape
        q, k, v = (x if x.stride(2) == 1 and x.stride(1) == d else x.contiguous() for x in (q, k, v))
        if cos is not None:
            cos, sin = cos.contiguous(), sin.contiguous()
        out = q.new_empty(r, h * d)
        rc = getattr(self._lib, f"paged_prefill_run_{self._sfx}")(
            q.data_ptr(),
            q.stride(0),
            k.data_ptr(),
            k.stride(0),
            v.data_ptr(),
            v.stride(0),
            cos.data_ptr() if cos is not None else None,
            sin.data_ptr() if sin is not None else None,
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            rows.tables.data_ptr(),
            rows.tables.shape[1],
            rows.row_seq.data_ptr(),
            rows.row_pos.data_ptr(),
            out.data_ptr(),
            r,
            h,
            self.num_kv_heads,
            d,
            self.block_size,
            scale,
            window or 0,
            softcap or 0.0,
            _sinks_ptr(sinks, h),
            rows.max_ctx,
            int(self._share and r >= SHARE_MIN_ROWS),
        )
        if rc != 0:
            raise MemoryError("paged attention kernel could not allocate its score buffer")
        return out

    def _torch(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        step: DecodeTables,
        scale: float,
    ) -> torch.Tensor:
        b, h, d = q.shape
        kvh, group = self.num_kv_heads, h // self.num_kv_heads
        slots, kv_index, mask = step.torch_index()
        write_cache(k_cache, slots, k)
        write_cache(v_cache, slots, v)
        keys, values = read_cache(k_cache, kv_index, q.dtype), read_cache(v_cache, kv_index, q.dtype)
        # the query heads that share a KV head act as `group` query rows of that head: no GQA expansion
        out = F.scaled_dot_product_attention(q.reshape(b, kvh, group, d), keys, values, attn_mask=mask, scale=scale)
        return out.reshape(b, h * d)


def _sinks_ptr(sinks: torch.Tensor | None, heads: int) -> int | None:
    """The kernels' sinks argument: NULL for none, else the address of [heads] contiguous float32 logits."""
    if sinks is None:
        return None
    if sinks.dtype != torch.float32 or not sinks.is_contiguous() or sinks.shape != (heads,):
        raise ValueError(f"attention sinks must be {heads} contiguous float32 logits, got {tuple(sinks.shape)}")
    return sinks.data_ptr()


def write_cache(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """Rows x [T, KVH, D] into cache slots `slots` [T] of one layer's cache [slots, KVH, D], in the cache's dtype
    (bfloat16 under a float32 model: rounded once, as the kernels store them)."""
    cache.index_copy_(0, slots, x.to(cache.dtype))


def read_cache(cache: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The cache slots `index` [B, ctx] of one layer's cache as [B, KVH, ctx, D] in `dtype` (the queries')."""
    b, ctx = index.shape
    return cache.index_select(0, index.view(-1)).view(b, ctx, *cache.shape[1:]).transpose(1, 2).to(dtype)


def cache_slots(block_table: list[int], block_size: int, end: int) -> torch.Tensor:
    """The cache slots of a sequence's positions 0..end-1 (its blocks' slots in table order)."""
    table = torch.tensor(block_table[: (end + block_size - 1) // block_size], dtype=torch.long)
    return (table[:, None] * block_size + torch.arange(block_size)).flatten()[:end]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' `x * cos + rotate_half(x) * sin` with `sin` = cat(-sin[:d/2], sin[d/2:]) precomputed:
    rotate_half(x) * sin = cat(-x2, x1) * sin = cat(x2, x1) * sin_folded exactly, so the result is bit for bit
    transformers'. x [T, heads, D]; cos/sin broadcast against it."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin


class _BlockTables:
    """Block tables as the kernels read them ([rows, width] int32, rows padded with block 0), checked on the way in:
    the C kernels trust every entry (a short table would read and write block 0, another sequence's; an id past
    the pool, memory outside it)."""

    def __init__(self, block_tables: list[list[int]], ends: list[int], block_size: int, num_blocks: int) -> None:
        """`ends`: the context each row reaches (its table must cover positions 0 .. end - 1); `num_blocks`: the
        KV pool's. Raises StepInputError otherwise."""
        for row, (table, end) in enumerate(zip(block_tables, ends, strict=True)):
            if len(table) * block_size < end:
                raise StepInputError(
                    f"the block table of row {row} has {len(table)} blocks of {block_size} "
                    f"positions for a context of {end}"
                )
        width = max(len(t) for t in block_tables)
        self.tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32)
        low, high = (int(x) for x in torch.aminmax(self.tables))
        if low < 0 or high >= num_blocks:
            raise StepInputError(
                f"a block table names block {low if low < 0 else high}; the KV pool has blocks 0 .. {num_blocks - 1}"
            )


class DecodeTables(_BlockTables):
    """Per-step index tensors of the decode rows, shared by every layer."""

    def __init__(self, block_tables: list[list[int]], ctx_lens: list[int], block_size: int, num_blocks: int) -> None:
        super().__init__(block_tables, ctx_lens, block_size, num_blocks)
        self.ctx_lens = torch.tensor(ctx_lens, dtype=torch.int32)
        self.block_size = block_size
        self._torch_index: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def torch_index(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(slots [B], kv_index [B, ctx], mask [B, 1, 1, ctx]) for the torch path, built once per step."""
        if self._torch_index is None:
            bs = self.block_size
            lens = self.ctx_lens.long()
            pos = torch.arange(int(lens.max()))
            index = self.tables.long()[:, pos // bs] * bs + pos % bs
            mask = pos[None, :] < lens[:, None]
            self._torch_index = (
                index.gather(1, (lens - 1)[:, None]).view(-1),
                torch.where(mask, index, 0).contiguous(),  # padding reads slot 0, masked out
                mask[:, None, None, :],
            )
        return self._torch_index


class PrefillRows(_BlockTables):
    """Per-step index tensors of the prefill rows, shared by every layer: each row's sequence and position."""

    def __init__(
        self, block_tables: list[list[int]], starts: list[int], lengths: list[int], block_size: int, num_blocks: int
    ) -> None:
        super().__init__(block_tables, [s + n for s, n in zip(starts, lengths, strict=True)], block_size, num_blocks)
        self.row_seq = torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), torch.tensor(lengths))
        self.row_pos = torch.cat(
            [torch.arange(s, s + n, dtype=torch.int32) for s, n in zip(starts, lengths, strict=True)]
        )
        self.max_ctx = max(s + n for s, n in zip(starts, lengths, strict=True))
