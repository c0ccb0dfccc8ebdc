"""Attention sinks (gpt-oss: a learned logit per head in the softmax's denominator, with no value) on the paged C
kernels against transformers' eager rule in torch ops (`attend_torch`): decode and prefill rows, with and without a
sliding window, on this CPU's build, the AVX2 build and the scalar one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_paged_attention_window import HEADS, KV_HEADS, check_decode, check_prefill

from engines.pytorch import native
from engines.pytorch.paged_attention import DecodeTables, PagedAttention

# large and small logits: a sink that dominates some heads' softmax, one that hardly counts, negative ones
SINKS = torch.tensor([3.0, -2.0, 0.5, 8.0, -20.0, 1.5, 0.0, -0.7])
# another target's build compiles the C library again: slow lane, as in the window test
BUILDS = [
    pytest.param((), id="native"),
    pytest.param(("-mno-avx512f",), id="avx2", marks=pytest.mark.slow),
    pytest.param(("-mno-avx2", "-mno-fma"), id="scalar", marks=pytest.mark.slow),
]
TYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One kernel cache for the module: each target's build is compiled once, not once a test."""
    return tmp_path_factory.mktemp("kernels")


def _force(flags: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels built with `flags` (another CPU's path), not the cached build of this CPU's."""
    if flags:
        monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, *flags])
        monkeypatch.delitem(native._loaded, "paged_attention", raising=False)


@pytest.mark.parametrize("flags", BUILDS)
@pytest.mark.parametrize("window", [None, 5, 40, 130])
@pytest.mark.parametrize(("dtype", "cache_dtype"), TYPES, ids=["f32", "bf16", "f32_kvbf16"])
@pytest.mark.parametrize("head_dim", [64, 40])  # 64: the AVX-512 prefill tile and the 8-key dot; 40: generic loops
def test_sinks_in_decode_and_prefill_are_the_eager_rule(
    flags: tuple[str, ...],
    window: int | None,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    head_dim: int,
    kernels: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert len(SINKS) == HEADS
    _force(flags, monkeypatch)
    check_decode(window, None, dtype, cache_dtype, head_dim, kernels, sinks=SINKS)
    check_prefill(window, None, dtype, cache_dtype, head_dim, kernels, sinks=SINKS)


@pytest.mark.parametrize("flags", BUILDS)
def test_the_sink_scales_the_output_and_adds_no_value(
    flags: tuple[str, ...], kernels: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one cached position the softmax over [score, sink] gives that position 1 / (1 + exp(sink - score)): the
    output is exactly that share of its value row. An ignored sink gives the whole value; a sink added to the
    outputs (or given a value) gives something else again."""
    _force(flags, monkeypatch)
    d = 64
    kernel = PagedAttention(HEADS, KV_HEADS, d, 16, torch.float32, kernels)
    if not kernel.uses_kernel:
        pytest.skip("no C compiler here: the engine runs these layers in torch ops")
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, n, d, generator=gen) for n in (HEADS, KV_HEADS, KV_HEADS))
    cos, sin = torch.ones(1, d), torch.zeros(1, d)  # no rotation: the score is q . k * scale as written
    cache = (torch.zeros(32, KV_HEADS, d), torch.zeros(32, KV_HEADS, d))
    step = DecodeTables([[1]], [1], 16, 2)
    got = kernel.decode(q, k, v, cos, sin, *cache, step, 0.125, None, None, SINKS).view(HEADS, d)
    plain = kernel.decode(q, k, v, cos, sin, *cache, step, 0.125).view(HEADS, d)
    values = v[0].repeat_interleave(HEADS // KV_HEADS, dim=0)
    score = (q[0] * k[0].repeat_interleave(HEADS // KV_HEADS, dim=0)).sum(-1) * 0.125
    share = torch.sigmoid(score - SINKS)[:, None]
    torch.testing.assert_close(plain, values, atol=1e-6, rtol=1e-6)  # one position without a sink: its value
    torch.testing.assert_close(got, share * values, atol=1e-6, rtol=1e-5)
    assert (got - values).abs().amax() > 1e-2  # the sink was not ignored
    assert (got - (share * values + SINKS[:, None])).abs().amax() > 1e-2  # nor added to the outputs
    assert (got[4] - share[4] * values[4]).abs().amax() < 1e-12  # sink -20: the share is all but 1


def test_sinks_that_are_not_one_float32_per_head_are_refused(tmp_path: Path) -> None:
    kernel = PagedAttention(HEADS, KV_HEADS, 64, 16, torch.float32, tmp_path)
    if not kernel.uses_kernel:
        pytest.skip("no C compiler here")
    q, k = torch.zeros(1, HEADS, 64), torch.zeros(1, KV_HEADS, 64)
    cache = (torch.zeros(32, KV_HEADS, 64), torch.zeros(32, KV_HEADS, 64))
    step = DecodeTables([[1]], [1], 16, 2)
    for bad in (SINKS.double(), SINKS[:4]):
        with pytest.raises(ValueError, match="attention sinks"):
            kernel.decode(q, k, k, torch.ones(1, 64), torch.zeros(1, 64), *cache, step, 0.125, None, None, bad)
