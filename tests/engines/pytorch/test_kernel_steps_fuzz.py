"""Step inputs drawn at random (hypothesis) through the C kernels, every buffer exactly the size the step needs (a
KV pool of just the blocks the tables name, weights of just their rows): decode attention over random head counts,
head sizes, context lengths and fragmented block tables, and the GEMM over GGUF blocks of every type at random
widths and row counts, each against the torch path. bench/asan_kernels.py runs this file under AddressSanitizer,
where a read past one of those buffers stops the run."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engines.pytorch import kernel_modes
from engines.pytorch.gguf_blocks import TYPES
from engines.pytorch.linear import Linear
from engines.pytorch.paged_attention import DecodeTables, PagedAttention
from tests.random_gguf_blocks import make_blocks

FUZZ = settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@FUZZ
@given(
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 4),
    head_dim=st.sampled_from((40, 64, 128)),
    block=st.sampled_from((1, 4, 16, 32)),
    ctx=st.lists(st.integers(1, 300), min_size=1, max_size=6),
    dtype=st.sampled_from((torch.float32, torch.bfloat16)),
    seed=st.integers(0, 2**16),
)
def test_decode_attention_on_random_steps(
    kernels: Path, kv_heads: int, group: int, head_dim: int, block: int, ctx: list[int], dtype: torch.dtype, seed: int
) -> None:
    heads = kv_heads * group
    kernel = PagedAttention(heads, kv_heads, head_dim, block, dtype, kernels)
    if not kernel.uses_kernel:
        pytest.skip("no C compiler here: the engine runs the torch path")
    torch_path = PagedAttention(heads, kv_heads, head_dim, block, dtype, kernels, use_kernel=False)
    rnd, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-c // block) for c in ctx)  # the pool holds exactly the blocks the tables name
    order = list(range(num_blocks))
    rnd.shuffle(order)
    tables, used = [], 0
    for c in ctx:
        tables.append(order[used : used + -(-c // block)])
        used += len(tables[-1])
    batch = len(ctx)
    q = torch.randn(batch, heads, head_dim, generator=gen).to(dtype)
    k, v = (torch.randn(batch, kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2))
    angles = torch.rand(batch, head_dim // 2, generator=gen) * 6
    cos, sin = torch.cat((angles, angles), -1).cos().to(dtype), torch.cat((angles, angles), -1).sin().to(dtype)
    sin_folded = torch.cat((-sin[:, : head_dim // 2], sin[:, head_dim // 2 :]), dim=-1)
    cache = [torch.randn(num_blocks * block, kv_heads, head_dim, generator=gen).to(dtype) for _ in range(2)]
    results = []
    for attn in (kernel, torch_path):
        k_cache, v_cache = cache[0].clone(), cache[1].clone()
        out = attn.decode(
            q, k, v, cos, sin_folded, k_cache, v_cache, DecodeTables(tables, ctx, block, num_blocks), head_dim**-0.5
        )
        results.append((out.float(), k_cache, v_cache))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(results[0][0], results[1][0], atol=tol, rtol=tol)
    assert torch.equal(results[0][1], results[1][1]) and torch.equal(results[0][2], results[1][2])


@FUZZ
@given(
    qtype=st.sampled_from(sorted(TYPES)),
    n=st.integers(1, 70),
    records=st.integers(1, 3),
    rows=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_gemm_over_blocks_on_random_steps(
    kernels: Path,
    monkeypatch: pytest.MonkeyPatch,
    qtype: str,
    n: int,
    records: int,
    rows: list[int],
    bias: bool,
    seed: int,
) -> None:
    monkeypatch.setattr(kernel_modes, "TILE_UNIT", False)
    k = TYPES[qtype].record_k * records * (1 if TYPES[qtype].record_k > 1 else 32)
    blocks = make_blocks(qtype, n, k, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    b = torch.randn(n, generator=gen) if bias else None
    from_blocks = Linear(None, b, True, kernels, None, blocks)
    if from_blocks.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here: the engine dequantizes the blocks for torch")
    weight = blocks.dequantize()
    for m in rows:
        x = torch.randn(m, k, generator=gen)
        torch.testing.assert_close(from_blocks(x), torch.nn.functional.linear(x, weight, b), atol=1e-3, rtol=1e-3)
