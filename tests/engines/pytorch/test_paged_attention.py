"""The decode-attention C kernel against the torch path (the fallback without a compiler) and a plain reference."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engines.interface import StepInputError
from engines.pytorch import native
from engines.pytorch.native import HelperThreads
from engines.pytorch.paged_attention import DecodeTables, PagedAttention, PrefillRows, rotate

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16


def _case(dtype: torch.dtype, batch: int = 5, seed: int = 0, longest: int = 70, head_dim: int = HEAD_DIM) -> dict:
    """`batch` decode rows with contexts of 1 .. `longest` positions (above 128: several spans, merged)."""
    gen = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    ctx_lens = [rnd.randint(1, longest) for _ in range(batch)]
    ctx_lens[0] = 1  # a sequence's first decode attends to its own new token only
    num_blocks = sum((c + BLOCK - 1) // BLOCK for c in ctx_lens) + 3
    blocks = list(range(num_blocks))
    rnd.shuffle(blocks)  # fragmented tables
    tables, used = [], 0
    for c in ctx_lens:
        n = (c + BLOCK - 1) // BLOCK
        tables.append(blocks[used : used + n])
        used += n
    shape = (num_blocks * BLOCK, KV_HEADS, head_dim)
    qkv = torch.randn(batch, (HEADS + 2 * KV_HEADS) * head_dim, generator=gen).to(dtype)
    angles = torch.rand(batch, head_dim // 2, generator=gen) * 6
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    return {
        "q": qkv[:, : HEADS * head_dim].view(batch, HEADS, head_dim),  # strided views, as the runner passes them
        "k": qkv[:, HEADS * head_dim : (HEADS + KV_HEADS) * head_dim].view(batch, KV_HEADS, head_dim),
        "v": qkv[:, (HEADS + KV_HEADS) * head_dim :].view(batch, KV_HEADS, head_dim),
        "cos": cos,
        "sin": sin,
        "sin_folded": torch.cat((-sin[:, : head_dim // 2], sin[:, head_dim // 2 :]), dim=-1),
        "k_cache": torch.randn(shape, generator=gen).to(dtype),
        "v_cache": torch.randn(shape, generator=gen).to(dtype),
        "tables": DecodeTables(tables, ctx_lens, BLOCK, num_blocks),
    }


def _transformers_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _run(attn: PagedAttention, case: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k_cache, v_cache = case["k_cache"].clone(), case["v_cache"].clone()
    out = attn.decode(
        case["q"],
        case["k"],
        case["v"],
        case["cos"],
        case["sin_folded"],
        k_cache,
        v_cache,
        case["tables"],
        case["q"].shape[-1] ** -0.5,
    )
    return out, k_cache, v_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("longest", "head_dim"), [(70, HEAD_DIM), (700, HEAD_DIM), (300, 128), (300, 40)])
def test_kernel_matches_torch_path_and_reference(
    dtype: torch.dtype, longest: int, head_dim: int, tmp_path: Path
) -> None:
    kernel = PagedAttention(HEADS, KV_HEADS, head_dim, BLOCK, dtype, tmp_path)
    if not kernel.uses_kernel:
        pytest.skip("no C compiler here: the engine runs the torch path")
    fallback = PagedAttention(HEADS, KV_HEADS, head_dim, BLOCK, dtype, tmp_path, use_kernel=False)
    assert not fallback.uses_kernel
    case = _case(dtype, longest=longest, head_dim=head_dim)
    out, k_cache, v_cache = _run(kernel, case)
    ref_out, ref_k, ref_v = _run(fallback, case)
    # both write the same (rotated) keys and values, bit for bit what transformers computes
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    slots, kv_index, mask = case["tables"].torch_index()
    cos, sin = case["cos"][:, None], case["sin"][:, None]
    assert torch.equal(k_cache[slots], _transformers_rotary(case["k"], cos, sin))
    # attention output: the same up to float rounding, and the same as a plain SDPA over the gathered cache
    q = _transformers_rotary(case["q"], cos, sin)
    keys, values = ref_k[kv_index].transpose(1, 2), ref_v[kv_index].transpose(1, 2)
    plain = F.scaled_dot_product_attention(
        q[:, :, None], keys, values, attn_mask=mask, scale=head_dim**-0.5, enable_gqa=True
    )
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref_out.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(out.float(), plain.reshape(out.shape).float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "longest"), [(24, 70), (1, 70), (3, 70), (1, 900), (6, 400)])
def test_helper_threads_give_the_same_bits(dtype: torch.dtype, batch: int, longest: int, tmp_path: Path) -> None:
    """Spans of context shared out between threads are computed exactly as by one thread."""
    alone = PagedAttention(HEADS, KV_HEADS, HEAD_DIM, BLOCK, dtype, tmp_path)
    if not alone.uses_kernel:
        pytest.skip("no C compiler here: the engine runs the torch path")
    shared = PagedAttention(HEADS, KV_HEADS, HEAD_DIM, BLOCK, dtype, tmp_path, helpers=HelperThreads(2, tmp_path))
    case = _case(dtype, batch=batch, seed=3, longest=longest)
    for got, want in zip(_run(shared, case), _run(alone, case), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_computes_the_same_bits_alone_or_in_a_batch(dtype: torch.dtype, tmp_path: Path) -> None:
    """A decode row's spans follow its own context only: alone it gives the bits it gives beside other rows (what
    exact speculative verification and batch-invariant decoding rest on)."""
    attn = PagedAttention(HEADS, KV_HEADS, HEAD_DIM, BLOCK, dtype, tmp_path, helpers=HelperThreads(2, tmp_path))
    if not attn.uses_kernel:
        pytest.skip("no C compiler here: the engine runs the torch path")
    case = _case(dtype, batch=6, seed=5, longest=500)
    together, _, _ = _run(attn, case)
    tables, lens = case["tables"].tables.tolist(), case["tables"].ctx_lens.tolist()
    for b in range(6):
        alone = dict(
            case,
            tables=DecodeTables([tables[b]], [lens[b]], BLOCK, case["k_cache"].shape[0] // BLOCK),
            **{name: case[name][b : b + 1] for name in ("q", "k", "v", "cos", "sin_folded")},
        )
        out, _, _ = _run(attn, alone)
        assert torch.equal(out[0], together[b])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_verification_rows_compute_the_bits_of_one_token_steps(dtype: torch.dtype, tmp_path: Path) -> None:
    """Consecutive positions of one sequence (a verification step's rows, which the kernel takes together, span by
    span) beside another sequence: each row gives the bits it gives as a one-token step, across a span boundary."""
    attn = PagedAttention(HEADS, KV_HEADS, HEAD_DIM, BLOCK, dtype, tmp_path, helpers=HelperThreads(2, tmp_path))
    if not attn.uses_kernel:
        pytest.skip("no C compiler here: the engine runs the torch path")
    case = _case(dtype, batch=8, seed=9, longest=300)
    tables, lens = case["tables"].tables.tolist(), case["tables"].ctx_lens.tolist()
    num_blocks = case["k_cache"].shape[0] // BLOCK
    seq = [num_blocks + i for i in (4, 0, 8, 2, 6, 1, 3, 7, 5)]  # 9 more blocks: 144 positions
    tables[1:7], lens[1:7] = [seq] * 6, [125 + j for j in range(6)]  # rows 1-6: positions 124-129
    for name in ("k_cache", "v_cache"):
        case[name] = torch.cat((case[name], torch.randn(9 * BLOCK, KV_HEADS, HEAD_DIM).to(dtype)))
    case["tables"] = DecodeTables(tables, lens, BLOCK, num_blocks + 9)
    together, k_cache, v_cache = _run(attn, case)
    for b in range(8):  # each row alone, over the cache the step left (every row's key and value written)
        alone = dict(
            case,
            tables=DecodeTables([tables[b]], [lens[b]], BLOCK, num_blocks + 9),
            k_cache=k_cache,
            v_cache=v_cache,
            **{name: case[name][b : b + 1] for name in ("q", "k", "v", "cos", "sin_folded")},
        )
        out, _, _ = _run(attn, alone)
        assert torch.equal(out[0], together[b]), f"row {b}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [0, 2])
def test_prefill_kernel_is_causal_attention_over_the_cache(dtype: torch.dtype, threads: int, tmp_path: Path) -> None:
    """Chunks that start at 0 and chunks that continue a sequence (a prefix already cached), against SDPA: the
    kernel rotates q and k, writes k and v to the cache and attends causally."""
    kernel = PagedAttention(
        HEADS, KV_HEADS, HEAD_DIM, BLOCK, dtype, tmp_path, helpers=HelperThreads(threads, tmp_path) if threads else None
    )
    if not kernel.uses_kernel:
        pytest.skip("no C compiler here: the engine runs the torch path")
    gen = torch.Generator().manual_seed(5)
    starts, lengths = [0, 20, 0, 33], [7, 13, 40, 1]
    num_blocks = sum((s + n + BLOCK - 1) // BLOCK for s, n in zip(starts, lengths, strict=True))
    blocks = torch.randperm(num_blocks, generator=gen).tolist()
    tables, used = [], 0
    for s, n in zip(starts, lengths, strict=True):
        need = (s + n + BLOCK - 1) // BLOCK
        tables.append(blocks[used : used + need])
        used += need
    k_cache = torch.randn(num_blocks * BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks * BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    rows = sum(lengths)
    # the chunk's q, k, v as the runner passes them: strided views of one projection output, not yet rotated
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen).to(dtype)
    q = qkv[:, : HEADS * HEAD_DIM].view(rows, HEADS, HEAD_DIM)
    k = qkv[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(rows, KV_HEADS, HEAD_DIM)
    v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM :].view(rows, KV_HEADS, HEAD_DIM)
    angles = torch.rand(rows, HEAD_DIM // 2, generator=gen) * 6
    cos, sin = torch.cat((angles, angles), dim=-1).cos().to(dtype), torch.cat((angles, angles), dim=-1).sin().to(dtype)
    sin_folded = torch.cat((-sin[:, : HEAD_DIM // 2], sin[:, HEAD_DIM // 2 :]), dim=-1)
    chunk_slots = torch.cat(
        [
            (torch.tensor(table)[:, None] * BLOCK + torch.arange(BLOCK)).flatten()[s : s + n]
            for table, s, n in zip(tables, starts, lengths, strict=True)
        ]
    )
    want_k, want_v = k_cache.clone(), v_cache.clone()
    want_k[chunk_slots] = _transformers_rotary(k, cos[:, None], sin[:, None])
    want_v[chunk_slots] = v
    out = kernel.prefill(
        q,
        k,
        v,
        cos,
        sin_folded,
        k_cache,
        v_cache,
        PrefillRows(tables, starts, lengths, BLOCK, num_blocks),
        HEAD_DIM**-0.5,
    )
    # the chunk's keys (rotated bit for bit as transformers rotates) and values are in their slots, nothing else moved
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)
    q = _transformers_rotary(q, cos[:, None], sin[:, None])
    row = 0
    for table, s, n in zip(tables, starts, lengths, strict=True):
        slots = (torch.tensor(table)[:, None] * BLOCK + torch.arange(BLOCK)).flatten()[: s + n]
        keys, values = k_cache[slots].transpose(0, 1)[None], v_cache[slots].transpose(0, 1)[None]
        mask = torch.arange(s + n)[None, :] <= torch.arange(s, s + n)[:, None]
        want = F.scaled_dot_product_attention(
            q[row : row + n].transpose(0, 1)[None], keys, values, attn_mask=mask, scale=HEAD_DIM**-0.5, enable_gqa=True
        )
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(
            out[row : row + n].float(), want[0].transpose(0, 1).reshape(n, -1).float(), atol=tol, rtol=tol
        )
        row += n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_rows_do_not_depend_on_the_chunking(dtype: torch.dtype, tmp_path: Path) -> None:
    """A row's bits depend only on its position and the cache, not on the chunk or tile it is in: a 70-token
    prompt in one chunk (among other rows) or in chunks of 7, 13 and 50 (other tile boundaries, a prefix already
    cached) gives the same output bits, so chunked prefill and prefix hits do not change results."""
    kernel = PagedAttention(HEADS, KV_HEADS, HEAD_DIM, BLOCK, dtype, tmp_path, helpers=HelperThreads(2, tmp_path))
    if not kernel.uses_kernel:
        pytest.skip("no C compiler here: the engine runs the torch path")
    gen = torch.Generator().manual_seed(11)
    n, other = 70, 21
    q = torch.randn(n, HEADS, HEAD_DIM, generator=gen).to(dtype)
    k = torch.randn(n, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    v = torch.randn(n, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    q2, k2, v2 = (torch.randn(other, x.shape[1], HEAD_DIM, generator=gen).to(dtype) for x in (q, k, v))
    table, table2 = [3, 0, 7, 5, 1], [2, 6]
    k_cache = torch.zeros(8 * BLOCK, KV_HEADS, HEAD_DIM, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    # one chunk, after another sequence's rows
    whole = kernel.prefill(
        torch.cat((q2, q)),
        torch.cat((k2, k)),
        torch.cat((v2, v)),
        None,
        None,
        k_cache,
        v_cache,
        PrefillRows([table2, table], [0, 0], [other, n], BLOCK, 8),
        HEAD_DIM**-0.5,
    )[other:]
    k_cache.zero_(), v_cache.zero_()
    parts, start = [], 0
    for size in (7, 13, 50):
        end = start + size
        parts.append(
            kernel.prefill(
                q[start:end],
                k[start:end],
                v[start:end],
                None,
                None,
                k_cache,
                v_cache,
                PrefillRows([table], [start], [size], BLOCK, 8),
                HEAD_DIM**-0.5,
            )
        )
        start = end
    assert torch.equal(torch.cat(parts), whole)


def test_rotate_is_transformers_rotary_bit_for_bit() -> None:
    case = _case(torch.float32)
    cos, sin = case["cos"][:, None], case["sin"][:, None]
    assert torch.equal(rotate(case["q"], cos, case["sin_folded"][:, None]), _transformers_rotary(case["q"], cos, sin))


# slow lane: compiles the C libraries again for another target (tens of seconds on 2 cores)
@pytest.mark.slow
@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx2", "-mno-fma")], ids=["avx2", "scalar"])
def test_the_other_builds_attend_as_the_reference(
    flags: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library built for CPUs without AVX-512 (and without AVX2: the scalar loops) decodes rows of several spans
    and prefills (there without the AVX-512 tile) as the reference does."""
    if not PagedAttention(HEADS, KV_HEADS, HEAD_DIM, BLOCK, torch.float32, tmp_path).uses_kernel:
        pytest.skip("no C compiler here: the engine runs the torch path")
    monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, *flags])
    monkeypatch.delitem(native._loaded, "paged_attention")
    try:
        for dtype in (torch.float32, torch.bfloat16):
            test_kernel_matches_torch_path_and_reference(dtype, 300, HEAD_DIM, tmp_path)
            test_prefill_kernel_is_causal_attention_over_the_cache(dtype, 2, tmp_path)
        test_a_bfloat16_cache_under_float32_activations(tmp_path)
    finally:
        native._loaded.pop("paged_attention", None)


def test_a_bfloat16_cache_under_float32_activations(tmp_path: Path) -> None:
    """kv_cache.dtype bfloat16 of a float32 model: keys (rotated in float32) and values are rounded to bfloat16 once,
    as they are written; the attention over them is float32, as the torch path and SDPA over that cache compute it,
    and shared between threads with the same bits."""
    kernel = PagedAttention(
        HEADS,
        KV_HEADS,
        HEAD_DIM,
        BLOCK,
        torch.float32,
        tmp_path,
        cache_dtype=torch.bfloat16,
        helpers=HelperThreads(2, tmp_path),
    )
    if not kernel.uses_kernel:
        pytest.skip("no C compiler here: the engine runs the torch path")
    alone = PagedAttention(HEADS, KV_HEADS, HEAD_DIM, BLOCK, torch.float32, tmp_path, cache_dtype=torch.bfloat16)
    fallback = PagedAttention(
        HEADS, KV_HEADS, HEAD_DIM, BLOCK, torch.float32, tmp_path, use_kernel=False, cache_dtype=torch.bfloat16
    )
    case = _case(torch.float32, batch=6, seed=4, longest=400)
    case["k_cache"], case["v_cache"] = case["k_cache"].bfloat16(), case["v_cache"].bfloat16()
    out, k_cache, v_cache = _run(kernel, case)
    assert out.dtype == torch.float32 and k_cache.dtype == torch.bfloat16
    ref_out, ref_k, ref_v = _run(fallback, case)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)
    slots, kv_index, mask = case["tables"].torch_index()
    cos, sin = case["cos"][:, None], case["sin"][:, None]
    assert torch.equal(k_cache[slots], _transformers_rotary(case["k"], cos, sin).bfloat16())
    q = _transformers_rotary(case["q"], cos, sin)
    keys, values = ref_k[kv_index].transpose(1, 2).float(), ref_v[kv_index].transpose(1, 2).float()
    plain = F.scaled_dot_product_attention(
        q[:, :, None], keys, values, attn_mask=mask, scale=HEAD_DIM**-0.5, enable_gqa=True
    )
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, plain.reshape(out.shape), atol=1e-5, rtol=1e-5)
    for got, want in zip(_run(alone, case), (out, k_cache, v_cache), strict=True):
        assert torch.equal(got, want)
    # a prefill chunk over the same cache: the torch path's result up to float rounding
    rows = PrefillRows(
        [case["tables"].tables[1].tolist()],
        [0],
        [int(case["tables"].ctx_lens[1])],
        BLOCK,
        case["k_cache"].shape[0] // BLOCK,
    )
    n = rows.max_ctx
    q, k, v = (torch.randn(n, x, HEAD_DIM) for x in (HEADS, KV_HEADS, KV_HEADS))
    got = kernel.prefill(q, k, v, None, None, k_cache.clone(), v_cache.clone(), rows, HEAD_DIM**-0.5)
    mask = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    want = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.bfloat16().float().transpose(0, 1)[None],
        v.bfloat16().float().transpose(0, 1)[None],
        attn_mask=mask,
        scale=HEAD_DIM**-0.5,
        enable_gqa=True,
    )
    torch.testing.assert_close(got, want[0].transpose(0, 1).reshape(n, -1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block", [1, 7, 48, 256])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_any_block_size_attends_as_the_torch_path(block: int, cache_dtype: torch.dtype, tmp_path: Path) -> None:
    """Spans are whole blocks (128 positions rounded up to a block, or one block past 128): rows of other sequences
    and a verification step's rows of one sequence, over blocks of any size, give the torch path's output."""
    kernel = PagedAttention(
        HEADS,
        KV_HEADS,
        HEAD_DIM,
        block,
        torch.float32,
        tmp_path,
        cache_dtype=cache_dtype,
        helpers=HelperThreads(2, tmp_path),
    )
    if not kernel.uses_kernel:
        pytest.skip("no C compiler here: the engine runs the torch path")
    fallback = PagedAttention(
        HEADS, KV_HEADS, HEAD_DIM, block, torch.float32, tmp_path, use_kernel=False, cache_dtype=cache_dtype
    )
    rnd, gen = random.Random(block), torch.Generator().manual_seed(block)
    lens = [rnd.randint(1, 600) for _ in range(4)] + [300, 301, 302]  # the last three: one sequence's rows
    per = [(c + block - 1) // block for c in lens[:4] + lens[-1:]]  # the shared sequence's table covers its last row
    blocks = list(range(sum(per)))
    rnd.shuffle(blocks)
    tables, used = [], 0
    for n in per:
        tables.append(blocks[used : used + n])
        used += n
    tables += [tables[4]] * 2
    batch = len(lens)
    q, k, v = (torch.randn(batch, n, HEAD_DIM, generator=gen) for n in (HEADS, KV_HEADS, KV_HEADS))
    angles = torch.rand(batch, HEAD_DIM // 2, generator=gen) * 6
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    sin_folded = torch.cat((-sin[:, : HEAD_DIM // 2], sin[:, HEAD_DIM // 2 :]), dim=-1)
    k_cache = torch.randn(used * block, KV_HEADS, HEAD_DIM, generator=gen).to(cache_dtype)
    v_cache = torch.randn(used * block, KV_HEADS, HEAD_DIM, generator=gen).to(cache_dtype)
    outs = [
        attn.decode(
            q,
            k,
            v,
            cos,
            sin_folded,
            k_cache.clone(),
            v_cache.clone(),
            DecodeTables(tables, lens, block, used),
            HEAD_DIM**-0.5,
        )
        for attn in (kernel, fallback)
    ]
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_tables_the_kernels_would_misread_are_refused_before_the_call() -> None:
    """A table too short for the row's context (the kernel would read and write block 0, another sequence's), or a
    block id outside the pool: a StepInputError, raised where the step's tables are built."""
    assert DecodeTables([[3, 1], [0]], [32, 9], BLOCK, 4).tables.tolist() == [[3, 1], [0, 0]]
    with pytest.raises(StepInputError, match="row 1 has 1 blocks of 16 positions for a context of 17"):
        DecodeTables([[3, 1], [0]], [32, 17], BLOCK, 4)
    with pytest.raises(StepInputError, match=r"names block 4; the KV pool has blocks 0 \.\. 3"):
        DecodeTables([[3, 4], [0]], [32, 9], BLOCK, 4)
    with pytest.raises(StepInputError, match="names block -1"):
        DecodeTables([[-1]], [1], BLOCK, 4)
    assert PrefillRows([[2, 0]], [10], [22], BLOCK, 4).max_ctx == 32
    with pytest.raises(StepInputError, match="row 0 has 2 blocks of 16 positions for a context of 33"):
        PrefillRows([[2, 0]], [10], [23], BLOCK, 4)
    with pytest.raises(StepInputError, match="names block 9"):
        PrefillRows([[1], [9]], [0, 0], [3, 3], BLOCK, 4)


def test_a_step_with_a_bad_table_fails_without_touching_the_cache(tmp_path: Path) -> None:
    """Through the runner: a decode whose table lacks the block of its position raises before any kernel runs,
    and the cache holds what it held."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from engines.pytorch.model_runner import PagedModelRunner
    from engines.types import SamplingParams, SequenceStep

    torch.manual_seed(0)
    model = (
        LlamaForCausalLM(
            LlamaConfig(
                vocab_size=96,
                hidden_size=64,
                intermediate_size=160,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
            )
        )
        .float()
        .eval()
    )
    runner = PagedModelRunner(model, num_blocks=4, block_size=16, kernel_cache_dir=tmp_path, gemm_threads=1)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    prompt = list(range(1, 17))
    runner.forward([SequenceStep("s", prompt, 0, [2], True, params, prompt, 16, 0)])
    before = runner.k_cache.clone()
    with pytest.raises(StepInputError, match="1 blocks of 16 positions for a context of 17"):
        runner.forward([SequenceStep("s", [5], 16, [2], True, params, [*prompt, 5], 16, 1)])  # position 16: block 2
    with pytest.raises(StepInputError, match="names block 4"):
        runner.forward([SequenceStep("s", [5], 16, [2, 4], True, params, [*prompt, 5], 16, 1)])
    assert torch.equal(runner.k_cache, before)
