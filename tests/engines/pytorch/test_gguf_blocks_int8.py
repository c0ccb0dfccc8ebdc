"""The int8 kernels (csrc/gemm_blocks_int8.h, `kernel_modes.int8_activations`): with activations that 8 bits hold
exactly they give the float64 product up to float32 rounding, for every type they read and at any number of rows,
alone and with a helper thread; on other activations the error is the rounding of x to 8 bits; a row's result does
not depend on its batch; the types they do not read (Q8_0, 16-bit) keep the float32 kernels' bits; and the builds
without VNNI (the same integer sums from vpmaddubsw) agrees; builds without VBMI and GFNI have no int8 kernels
(test_gguf_blocks_kernels.py checks that int8_activations changes nothing there)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.pytorch import gemm_library, kernel_modes, native
from engines.pytorch.dense_ops import DenseOps
from engines.pytorch.gated_activation import GatedActivation
from engines.pytorch.gguf_blocks import TYPES, GGUFBlocks
from engines.pytorch.kernel_modes import int8_activations, int8_available
from engines.pytorch.linear import Linear
from engines.pytorch.native import HelperThreads
from tests.random_gguf_blocks import make_blocks

INT8_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "MXFP4")
ROWS = (1, 3, 4, 5, 9, 17)


@pytest.fixture(autouse=True)
def _register_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Off the tile unit (its prompt rows would take it on AMX CPUs); skipped where this build has no int8 kernels."""
    monkeypatch.setattr(kernel_modes, "TILE_UNIT", False)
    if not int8_available(tmp_path):
        pytest.skip("no int8 kernels in this CPU's build (they need AVX-512 with VBMI and GFNI)")


def _exact_rows(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Rows whose every 32-k group is d * n with n integers in [-127, 127] (one of them +-127) and d a power of two:
    their 8-bit quantization is exact."""
    n = torch.randint(-127, 128, (m, k // 32, 32), generator=gen)
    n[:, :, 0] = 127 * (2 * torch.randint(0, 2, (m, k // 32), generator=gen) - 1)
    d = torch.pow(2.0, torch.randint(-8, 2, (m, k // 32, 1), generator=gen).double())
    return (n.double() * d).reshape(m, k).float()


def _bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.double().abs() @ weight.double().abs().T


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("qtype", INT8_TYPES)
def test_exactly_quantized_rows_give_the_product(qtype: str, threads: int, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(threads)
    blocks = make_blocks(qtype, 200, 512, seed=3)
    weight = blocks.dequantize()
    helpers = HelperThreads(threads, tmp_path) if threads > 1 else None
    lin = Linear(None, None, True, tmp_path, helpers, blocks)
    for m in ROWS:
        x = _exact_rows(m, 512, gen)
        with int8_activations():
            got = lin(x)
        want = x.double() @ weight.double().T
        assert ((got.double() - want).abs() <= 1e-5 * _bound(x, weight) + 1e-30).all(), (qtype, m)


@pytest.mark.parametrize("qtype", INT8_TYPES)
def test_other_rows_differ_by_their_rounding_to_8_bits(qtype: str, tmp_path: Path) -> None:
    """|x - x8| is at most half a step (max|x| / 254 of its group) a value, so the result moves by at most that
    times sum |A q| (|A q| <= |w| + |B|, B the column's offset: a few times |w| for these blocks); in practice about
    1% of the result's scale, as llama.cpp's."""
    gen = torch.Generator().manual_seed(7)
    blocks = make_blocks(qtype, 96, 1024, seed=5)
    weight = blocks.dequantize()
    lin = Linear(None, None, True, tmp_path, None, blocks)
    x = torch.randn(6, 1024, generator=gen)
    with int8_activations():
        got = lin(x)
    want = torch.nn.functional.linear(x, weight)
    relative = (got - want).norm() / want.norm()
    assert 0 < relative < 0.02, (qtype, float(relative))
    assert not torch.equal(got, lin(x))  # outside the context: the float32 kernels


def test_a_rows_result_does_not_depend_on_its_batch(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(2)
    lin = Linear(
        None,
        None,
        True,
        tmp_path,
        HelperThreads(2, tmp_path),
        GGUFBlocks.cat([make_blocks("Q4_K", 64, 512, 1), make_blocks("Q6_K", 32, 512, 2)]),
    )
    x = torch.randn(11, 512, generator=gen)
    with int8_activations():
        whole = lin(x)
        for i in (0, 4, 10):
            assert torch.equal(lin(x[i : i + 1])[0], whole[i])
        assert torch.equal(lin(x[3:8]), whole[3:8])


@pytest.mark.parametrize("qtype", ["Q8_0", "BF16", "F16"])
def test_types_without_int8_kernels_keep_the_float32_bits(qtype: str, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(4)
    lin = Linear(None, None, True, tmp_path, None, make_blocks(qtype, 48, 512, 6))
    x = torch.randn(3, 512, generator=gen)
    plain = lin(x)
    with int8_activations():
        assert torch.equal(lin(x), plain)


def test_fused_gate_and_up_take_the_int8_kernels(tmp_path: Path) -> None:
    """The gate/up job with SiLU (gemm_silu_f32_par) quantizes x once and reads both halves with the int8 kernels."""
    gen = torch.Generator().manual_seed(8)
    dense = DenseOps(True, torch.float32, tmp_path, None)
    gate, up = make_blocks("Q4_K", 64, 512, 9), make_blocks("Q4_K", 64, 512, 10)
    fused = GatedActivation(None, None, torch.nn.SiLU(), True, tmp_path, None, dense, (gate, up))
    x = _exact_rows(5, 512, gen)
    with int8_activations():
        got = fused(x)
    g, u = (x.double() @ w.dequantize().double().T for w in (gate, up))
    want = torch.nn.functional.silu(g) * u
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)


# slow lane: compiles the C library again for another target (tens of seconds on 2 cores)
@pytest.mark.slow
def test_the_build_without_vnni(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without VNNI (Ice Lake servers have it, some AVX-512 CPUs with VBMI do not), vpmaddubsw + vpmaddwd make the
    same integer sums: the same bits."""
    gen = torch.Generator().manual_seed(5)
    cases = [make_blocks(t, 40, 512, i) for i, t in enumerate(sorted(TYPES))]
    xs = {m: torch.randn(m, 512, generator=gen) for m in (1, 5, 20)}
    here = {b.qtype: Linear(None, None, True, tmp_path, None, b) for b in cases}
    with int8_activations():
        int8_here = {q: {m: lin(x) for m, x in xs.items()} for q, lin in here.items()}
    monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, "-mno-avx512vnni"])
    monkeypatch.delitem(native._loaded, "gemm", raising=False)
    monkeypatch.setattr(gemm_library, "_lib", None)
    assert int8_available(tmp_path)
    for b in cases:
        other = Linear(None, None, True, tmp_path, None, b)
        for m, x in xs.items():
            with int8_activations():
                assert torch.equal(other(x), int8_here[b.qtype][m]), (b.qtype, m)
    monkeypatch.delitem(native._loaded, "gemm")
