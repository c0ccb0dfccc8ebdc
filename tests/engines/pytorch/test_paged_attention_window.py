"""Sliding-window and soft-capped attention on the paged C kernels against transformers' eager rule in torch ops
(`layers/attention.py` `attend_torch`): decode rows and prefill rows, across block and span boundaries, windows
smaller than a block and larger than the sequence, caps across tanh's whole range, every pair of types and the other
builds (AVX2, scalar)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engines.pytorch import native
from engines.pytorch.layers.attention import Attention, SequenceRows, attend_torch
from engines.pytorch.paged_attention import DecodeTables, PagedAttention, PrefillRows, cache_slots

HEADS, KV_HEADS, BLOCK = 8, 2, 16
# (window, softcap): a window inside one block, across blocks and spans (decode spans are 128 positions), one
# past every context here, soft-capping alone, and both together (Gemma 2's local layers)
SHAPES = [(5, None), (40, None), (130, None), (1000, None), (None, 2.0), (24, 3.0)]
TYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)]


def _tolerance(dtype: torch.dtype, cache_dtype: torch.dtype) -> float:
    """float32 throughout: summation order only; anything in bfloat16 rounds (keys as they are cached, too)."""
    return 3e-2 if torch.bfloat16 in (dtype, cache_dtype) else 2e-5


def _attention(
    head_dim: int, window: int | None, softcap: float | None, sinks: torch.Tensor | None = None
) -> Attention:
    return Attention(
        layer_idx=0,
        qkv=None,
        o=None,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,  # type: ignore[arg-type]
        head_dim=head_dim,
        scaling=head_dim**-0.5,
        sliding_window=window,
        softcap=softcap,
        sinks=sinks,
    )


def _sequences(rnd: random.Random, lengths: list[tuple[int, int]]) -> tuple[list[list[int]], int]:
    """Shuffled block tables for sequences of (start, rows) and the pool's block count."""
    need = [(s + n + BLOCK - 1) // BLOCK for s, n in lengths]
    blocks = list(range(sum(need) + 2))
    rnd.shuffle(blocks)
    tables, used = [], 0
    for n in need:
        tables.append(blocks[used : used + n])
        used += n
    return tables, len(blocks)


def _reference(
    attention: Attention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: list[list[int]],
    lengths: list[tuple[int, int]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """transformers' eager attention with the layer's window and soft-cap, one sequence at a time, in float32 over
    float32 copies of the caches: the output and those caches, written."""
    sequences, slots, row = [], [], 0
    for table, (start, n) in zip(tables, lengths, strict=True):
        seq_slots = cache_slots(table, BLOCK, start + n)
        sequences.append(SequenceRows(row, n, start, seq_slots))
        slots.append(seq_slots[start:])
        row += n
    f32 = torch.float32
    k32, v32 = k_cache.to(f32, copy=True), v_cache.to(f32, copy=True)
    out = attend_torch(
        attention, q.to(f32), k.to(f32), v.to(f32), cos.to(f32), sin.to(f32), k32, v32, torch.cat(slots), sequences
    )
    return out, k32, v32


def _inputs(rows: int, head_dim: int, slots: int, dtype: torch.dtype, cache_dtype: torch.dtype, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    angles = torch.rand(rows, head_dim // 2, generator=gen) * 6
    emb = torch.cat((angles, angles), dim=-1)
    sin = emb.sin()
    return {
        "q": torch.randn(rows, HEADS, head_dim, generator=gen).to(dtype),
        "k": torch.randn(rows, KV_HEADS, head_dim, generator=gen).to(dtype),
        "v": torch.randn(rows, KV_HEADS, head_dim, generator=gen).to(dtype),
        "cos": emb.cos().to(dtype),
        "sin": torch.cat((-sin[:, : head_dim // 2], sin[:, head_dim // 2 :]), dim=-1).to(dtype),  # folded
        "k_cache": (torch.randn(slots * BLOCK, KV_HEADS, head_dim, generator=gen) * 2).to(cache_dtype),
        "v_cache": torch.randn(slots * BLOCK, KV_HEADS, head_dim, generator=gen).to(cache_dtype),
    }


def _kernel(head_dim: int, dtype: torch.dtype, cache_dtype: torch.dtype, tmp_path: Path) -> PagedAttention:
    kernel = PagedAttention(HEADS, KV_HEADS, head_dim, BLOCK, dtype, tmp_path, cache_dtype=cache_dtype)
    if not kernel.uses_kernel:
        pytest.skip("no C compiler here: the engine runs these layers in torch ops")
    return kernel


def check_decode(
    window: int | None,
    softcap: float | None,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    head_dim: int,
    tmp_path: Path,
    seed: int = 0,
    sinks: torch.Tensor | None = None,
) -> None:
    """One-token rows of contexts 1 .. 300 (several spans), and a verification step's consecutive rows of one
    sequence, as the reference."""
    rnd = random.Random(seed)
    contexts = [1, 3, 17, 129, 200, 300, rnd.randint(2, 300)]
    lengths = [(c - 1, 1) for c in contexts] + [(250, 5)]  # the last: 5 rows at positions 250..254, one sequence
    tables, num_blocks = _sequences(rnd, lengths)
    ends = [c for c in contexts] + [251 + i for i in range(5)]
    row_tables = tables[:-1] + [tables[-1]] * 5
    x = _inputs(len(ends), head_dim, num_blocks, dtype, cache_dtype, seed)
    attention = _attention(head_dim, window, softcap, sinks)
    want, want_k, want_v = _reference(
        attention, x["q"], x["k"], x["v"], x["cos"], x["sin"], x["k_cache"], x["v_cache"], tables, lengths
    )
    kernel = _kernel(head_dim, dtype, cache_dtype, tmp_path)
    k_cache, v_cache = x["k_cache"].clone(), x["v_cache"].clone()
    got = kernel.decode(
        x["q"],
        x["k"],
        x["v"],
        x["cos"],
        x["sin"],
        k_cache,
        v_cache,
        DecodeTables(row_tables, ends, BLOCK, num_blocks),
        attention.scaling,
        window,
        softcap,
        sinks,
    )
    tol = _tolerance(dtype, cache_dtype)
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
    # the kernel wrote the rotated keys and the values the reference did (in the cache's type)
    torch.testing.assert_close(k_cache.float(), want_k, atol=tol, rtol=tol)
    torch.testing.assert_close(v_cache.float(), want_v, atol=tol, rtol=tol)


def check_prefill(
    window: int | None,
    softcap: float | None,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    head_dim: int,
    tmp_path: Path,
    seed: int = 0,
    sinks: torch.Tensor | None = None,
) -> None:
    """Prefill chunks: a whole prompt of 70 rows, a chunk continuing a sequence at 100 (its window reaching into
    the cache before it), a one-row chunk and a chunk of 37 rows starting mid-block, as the reference."""
    rnd = random.Random(seed)
    lengths = [(0, 70), (100, 40), (7, 1), (45, 37)]
    tables, num_blocks = _sequences(rnd, lengths)
    rows = sum(n for _, n in lengths)
    x = _inputs(rows, head_dim, num_blocks, dtype, cache_dtype, seed + 1)
    attention = _attention(head_dim, window, softcap, sinks)
    want, _, _ = _reference(
        attention, x["q"], x["k"], x["v"], x["cos"], x["sin"], x["k_cache"], x["v_cache"], tables, lengths
    )
    kernel = _kernel(head_dim, dtype, cache_dtype, tmp_path)
    k_cache, v_cache = x["k_cache"].clone(), x["v_cache"].clone()
    got = kernel.prefill(
        x["q"],
        x["k"],
        x["v"],
        x["cos"],
        x["sin"],
        k_cache,
        v_cache,
        PrefillRows(tables, [s for s, _ in lengths], [n for _, n in lengths], BLOCK, num_blocks),
        attention.scaling,
        window,
        softcap,
        sinks,
    )
    tol = _tolerance(dtype, cache_dtype)
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize(("window", "softcap"), SHAPES)
@pytest.mark.parametrize(("dtype", "cache_dtype"), TYPES, ids=["f32", "bf16", "f32_kvbf16"])
@pytest.mark.parametrize("head_dim", [64, 40])  # 64: the AVX-512 tile and the 8-key dot; 40: the generic loops
def test_windowed_and_capped_decode_is_the_eager_rule(
    window: int | None,
    softcap: float | None,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    head_dim: int,
    tmp_path: Path,
) -> None:
    check_decode(window, softcap, dtype, cache_dtype, head_dim, tmp_path)


@pytest.mark.parametrize(("window", "softcap"), SHAPES)
@pytest.mark.parametrize(("dtype", "cache_dtype"), TYPES, ids=["f32", "bf16", "f32_kvbf16"])
@pytest.mark.parametrize("head_dim", [64, 40])
def test_windowed_and_capped_prefill_is_the_eager_rule(
    window: int | None,
    softcap: float | None,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    head_dim: int,
    tmp_path: Path,
) -> None:
    check_prefill(window, softcap, dtype, cache_dtype, head_dim, tmp_path)


# Gemma 2's own cap (scores / cap near 0: tanh's series) and one every score saturates at (most past exp's clamp at
# |scores / cap| > 43.5): with head size 64 the prompt rows run through the AVX-512 tile's vector soft-cap
@pytest.mark.parametrize("softcap", [50.0, 0.05])
@pytest.mark.parametrize(("dtype", "cache_dtype"), TYPES, ids=["f32", "bf16", "f32_kvbf16"])
def test_capped_rows_over_tanhs_whole_range_are_the_eager_rule(
    softcap: float, dtype: torch.dtype, cache_dtype: torch.dtype, tmp_path: Path
) -> None:
    check_prefill(None, softcap, dtype, cache_dtype, 64, tmp_path)
    check_decode(None, softcap, dtype, cache_dtype, 64, tmp_path)


def test_a_window_past_the_context_gives_the_bits_of_no_window(tmp_path: Path) -> None:
    """A window no row reaches the end of is plain causal attention: the same bits as the kernel without one."""
    rnd = random.Random(3)
    lengths = [(c - 1, 1) for c in (1, 40, 140, 260)]
    tables, num_blocks = _sequences(rnd, lengths)
    x = _inputs(len(lengths), 64, num_blocks, torch.float32, torch.float32, 3)
    kernel = _kernel(64, torch.float32, torch.float32, tmp_path)
    outs = []
    for window in (None, 260, 10_000):
        step = DecodeTables(tables, [s + 1 for s, _ in lengths], BLOCK, num_blocks)
        outs.append(
            kernel.decode(
                x["q"],
                x["k"],
                x["v"],
                x["cos"],
                x["sin"],
                x["k_cache"].clone(),
                x["v_cache"].clone(),
                step,
                0.125,
                window,
            )
        )
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_a_windowed_row_reads_no_position_before_its_window(tmp_path: Path) -> None:
    """The blocks wholly before a row's window are skipped, not masked: poisoning them (NaN keys and values)
    changes nothing, in decode and in prefill."""
    rnd = random.Random(4)
    window, start = 20, 200
    lengths = [(start, 1)]
    tables, num_blocks = _sequences(rnd, lengths)
    x = _inputs(1, 64, num_blocks, torch.float32, torch.float32, 4)
    kernel = _kernel(64, torch.float32, torch.float32, tmp_path)
    step = DecodeTables(tables, [start + 1], BLOCK, num_blocks)
    clean = kernel.decode(
        x["q"], x["k"], x["v"], x["cos"], x["sin"], x["k_cache"].clone(), x["v_cache"].clone(), step, 0.125, window
    )
    k_cache, v_cache = x["k_cache"].clone(), x["v_cache"].clone()
    for block in tables[0][: (start - window + 1) // BLOCK]:  # wholly before position start - window + 1
        k_cache[block * BLOCK : (block + 1) * BLOCK] = float("nan")
        v_cache[block * BLOCK : (block + 1) * BLOCK] = float("nan")
    poisoned = kernel.decode(x["q"], x["k"], x["v"], x["cos"], x["sin"], k_cache, v_cache, step, 0.125, window)
    assert torch.equal(clean, poisoned)
    rows = PrefillRows(tables, [start], [1], BLOCK, num_blocks)
    prefilled = kernel.prefill(x["q"], x["k"], x["v"], x["cos"], x["sin"], k_cache, v_cache, rows, 0.125, window)
    assert not prefilled.isnan().any()
    torch.testing.assert_close(prefilled, clean, atol=2e-5, rtol=2e-5)


def test_the_torch_path_refuses_rather_than_ignoring_a_window(tmp_path: Path) -> None:
    """Without the kernel, `decode` has no windowed path: it says so (the runner sends such layers to
    attend_torch instead)."""
    fallback = PagedAttention(HEADS, KV_HEADS, 64, BLOCK, torch.float32, tmp_path, use_kernel=False)
    x = _inputs(1, 64, 2, torch.float32, torch.float32, 5)
    with pytest.raises(RuntimeError, match="need the C kernel"):
        fallback.decode(
            x["q"],
            x["k"],
            x["v"],
            x["cos"],
            x["sin"],
            x["k_cache"],
            x["v_cache"],
            DecodeTables([[0]], [3], BLOCK, 2),
            0.125,
            4,
        )


# slow lane: compiles the C library again for another target (tens of seconds on 2 cores)
@pytest.mark.slow
@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx2", "-mno-fma")], ids=["avx2", "scalar"])
def test_the_other_builds_window_and_cap_as_the_reference(
    flags: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, *flags])
    monkeypatch.delitem(native._loaded, "paged_attention", raising=False)
    try:
        for window, softcap in [(5, None), (130, None), (24, 3.0), (None, 50.0), (None, 0.05)]:
            for dtype, cache_dtype in TYPES:
                check_decode(window, softcap, dtype, cache_dtype, 64, tmp_path)
                check_prefill(window, softcap, dtype, cache_dtype, 64, tmp_path)
    finally:
        native._loaded.pop("paged_attention", None)
