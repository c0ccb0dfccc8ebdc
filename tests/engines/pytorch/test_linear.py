"""The packed GEMM kernel against F.linear: shapes, bias, residual epilogue, strided input, batch invariance."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engines.interface import StepInputError
from engines.pytorch import gemm_library, kernel_modes, native
from engines.pytorch.dense_ops import DenseOps
from engines.pytorch.gated_activation import GatedActivation
from engines.pytorch.gguf_blocks import GGUFBlocks
from engines.pytorch.kernel_modes import CHUNK_PANELS, ROW_TILE
from engines.pytorch.linear import Linear
from engines.pytorch.native import HelperThreads
from tests.random_gguf_blocks import make_blocks

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize(
    ("n", "k", "bias"),
    [
        (96, 64, True),
        (50, 37, False),
        (80, 64, True),
        (64, 2100, False),
    ],  # padded columns; an odd panel count; a K split
)
def test_kernel_matches_f_linear(n: int, k: int, bias: bool, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(n + k)
    weight = torch.randn(n, k, generator=gen) * 0.05
    b = torch.randn(n, generator=gen) if bias else None
    lin = Linear(weight, b, True, tmp_path)
    if lin.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here: the engine uses oneDNN or torch")
    for m in (1, 2, 5, 6, 7, 13, 40):
        x = torch.randn(m, k, generator=gen)
        residual = torch.randn(m, n, generator=gen)
        ref = F.linear(x, weight, b)
        out = lin(x)
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lin(x, residual), residual + ref, atol=1e-4, rtol=1e-4)
        # a row's result does not depend on the other rows of the batch
        assert torch.equal(lin(x[m // 2 : m // 2 + 1]), out[m // 2 : m // 2 + 1])
    strided = torch.randn(4, 2 * k, generator=gen)[:, :k]
    torch.testing.assert_close(lin(strided), F.linear(strided, weight, b), atol=1e-4, rtol=1e-4)


def test_without_fast_kernels_is_f_linear(tmp_path: Path) -> None:
    weight, x = torch.randn(32, 16), torch.randn(3, 16)
    lin = Linear(weight, None, False, tmp_path)
    assert lin.kind == "torch"
    assert torch.equal(lin(x), F.linear(x, weight))


@pytest.mark.parametrize("tile_unit", [True, False])
def test_bfloat16_weights_match_f_linear(tile_unit: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both kernels for bfloat16 weights (the tile unit's, where there is one, and the registers')."""
    monkeypatch.setattr(kernel_modes, "TILE_UNIT", tile_unit)
    gen = torch.Generator().manual_seed(1)
    weight = (torch.randn(80, 96, generator=gen) * 0.05).bfloat16()
    bias = torch.randn(80, generator=gen).bfloat16()
    lin = Linear(weight, bias, True, tmp_path)
    if lin.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here")
    for m in (1, 3, 7, 20):
        x = torch.randn(m, 96, generator=gen).bfloat16()
        residual = torch.randn(m, 80, generator=gen).bfloat16()
        out = lin(x)
        assert out.dtype == torch.bfloat16
        # float32 sums of exact products, rounded once: within one bfloat16 step of torch's
        torch.testing.assert_close(out, F.linear(x, weight, bias), atol=2e-2, rtol=1e-2)
        torch.testing.assert_close(lin(x, residual), residual + F.linear(x, weight, bias), atol=3e-2, rtol=2e-2)
        assert torch.equal(lin(x[:1]), out[:1])


def test_helper_threads_give_the_same_bits(tmp_path: Path) -> None:
    """Large steps shared with helper threads (tiles of column chunks x ROW_TILE rows of the GEMM, row chunks of the
    norm and activation) are computed exactly as on one thread, past the 96-row M block and the first row tile."""
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(400, 64, generator=gen) * 0.05  # 25 panels: a whole and a partial CHUNK_PANELS
    alone, shared = (
        Linear(weight, None, True, tmp_path),
        Linear(weight, None, True, tmp_path, HelperThreads(2, tmp_path)),
    )
    if alone.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here")
    x = torch.randn(300, 64, generator=gen)
    assert x.shape[0] > ROW_TILE and CHUNK_PANELS < 25 < 2 * CHUNK_PANELS
    assert torch.equal(shared(x), alone(x))
    residual32 = torch.randn(300, 400, generator=gen)
    assert torch.equal(shared(x, residual32), alone(x, residual32))
    assert torch.equal(alone(x)[250:251], alone(x[250:251]))
    bf16 = weight.bfloat16()
    residual = torch.randn(300, 400, generator=gen).bfloat16()
    bf16_alone, bf16_shared = (
        Linear(bf16, None, True, tmp_path),
        Linear(bf16, None, True, tmp_path, HelperThreads(2, tmp_path)),
    )
    assert torch.equal(bf16_shared(x.bfloat16(), residual), bf16_alone(x.bfloat16(), residual))
    norm = torch.nn.Module()
    norm.weight, norm.variance_epsilon = torch.nn.Parameter(torch.rand(64, generator=gen)), 1e-5
    ops, shared_ops = (
        DenseOps(True, torch.float32, tmp_path),
        DenseOps(True, torch.float32, tmp_path, HelperThreads(2, tmp_path)),
    )
    assert torch.equal(shared_ops.rms_norm(norm, x), ops.rms_norm(norm, x))
    torch.testing.assert_close(ops.rms_norm(norm, x), F.rms_norm(x, (64,), norm.weight, 1e-5), atol=1e-5, rtol=1e-5)
    gate_up = torch.randn(300, 128, generator=gen)
    assert torch.equal(shared_ops.act_mul(torch.nn.SiLU(), gate_up), ops.act_mul(torch.nn.SiLU(), gate_up))
    torch.testing.assert_close(ops.act_mul(torch.nn.SiLU(), gate_up), F.silu(gate_up[:, :64]) * gate_up[:, 64:])


def _tile_unit(lin: Linear | GatedActivation) -> bool:
    return lin._blocks is not None and lin._blocks.tile_unit


def _max_error(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> float:
    ref = x.double() @ weight.double().T + (bias.double() if bias is not None else 0.0)
    return (out.double() - ref).abs().max().item()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("qtype", kernel_modes.TILE_UNIT_TYPES)
def test_tile_unit_takes_large_steps_and_their_rows_do_not_depend_on_the_batch(
    qtype: str, threads: int, tmp_path: Path
) -> None:
    """With AMX, steps of more than TILE_UNIT_MIN_ROWS rows on Q4_0 / Q4_1 / Q8_0 panels go through the tile unit:
    there a row's bits are the same in every such step (one row tile and the next, past ROW_TILE, with or without
    helper threads), and at least as close to the float64 product as the float32 FMA kernel's (bias, residual, a
    padded panel). Smaller steps are the register kernels': the float32 kernel's bits; a step's prompt rows always go
    through the tile unit, its decode rows only where there are more than TILE_UNIT_MIN_ROWS of them."""
    gen = torch.Generator().manual_seed(9)
    helpers = HelperThreads(threads, tmp_path) if threads > 1 else None
    blocks = make_blocks(qtype, 216, 256, seed=int(torch.randint(0, 2**31, (1,), generator=gen)))  # 14 panels
    weight, bias = blocks.dequantize(), torch.randn(216, generator=gen)
    plain, packed = Linear(weight, bias, True, tmp_path, helpers), Linear(weight, bias, True, tmp_path, helpers, blocks)
    if not _tile_unit(packed):
        pytest.skip("no AMX here (or no C compiler)")
    small = kernel_modes.TILE_UNIT_MIN_ROWS
    x_all, res_all = torch.randn(ROW_TILE + 21, 256, generator=gen), torch.randn(ROW_TILE + 21, 216, generator=gen)
    full = packed(x_all)
    for m in (small + 1, 32, 40, ROW_TILE + 21):
        x = torch.cat((x_all[: m - small - 1], x_all[-small - 1 :]))  # the last rows, in another row tile
        assert torch.equal(packed(x)[-small - 1 :], full[-small - 1 :])
        assert torch.equal(packed(x_all[:m], res_all[:m]), res_all[:m] + full[:m])  # bias, then the residual
    assert not torch.equal(full[:small], plain(x_all[:small]))  # other bits than the FMA kernel's ...
    assert _max_error(full, x_all, weight, bias) <= _max_error(plain(x_all), x_all, weight, bias)  # ... as close
    torch.testing.assert_close(full, F.linear(x_all, weight, bias), atol=5e-5, rtol=1e-4)
    for m in (1, 3, small):  # the register kernels
        assert torch.equal(packed(x_all[:m]), plain(x_all[:m]))
    # a step's decode rows (before prompt_from) keep the register kernels' bits beside prompt rows on the tile unit
    mixed = packed(x_all[:40], res_all[:40], prompt_from=5)
    assert torch.equal(mixed[:5], plain(x_all[:5], res_all[:5])) and torch.equal(mixed[5:], res_all[5:40] + full[5:40])


def _amplified(
    x: torch.Tensor, weight: torch.Tensor, row: int, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """x and weight with their last two k replaced so that `row`'s result is what is left of torch's float32 sum
    after two bfloat16 roundings: `row` then shows the low bits of torch's sums, which rounding random data to
    bfloat16 hides (a one-bit difference in the float32 sum rarely moves its bfloat16)."""
    x, weight = x.clone(), weight.clone()
    k = x.shape[1]
    x[row, k - 2 :], weight[:, k - 2 :] = 0, 0
    for i in range(2):
        correction = F.linear(x, weight, bias)[row]
        x[row, k - 2 + i], weight[:, k - 2 + i] = 1.0, -correction
    return x, weight


@pytest.mark.parametrize("threads", [1, 2])
def test_bfloat16_tile_unit_gives_torchs_bits_and_rows_do_not_depend_on_the_batch(threads: int, tmp_path: Path) -> None:
    """bfloat16 weights on the tile unit sum as oneDNN does for torch's calls of up to 32 rows (transformers' decode
    steps): the same bits, low ones included; and a row's bits do not depend on the rest of the step."""
    gen = torch.Generator().manual_seed(17)
    helpers = HelperThreads(threads, tmp_path) if threads > 1 else None
    for n, k, with_bias in ((576, 576, False), (200, 1536, True)):  # SmolLM2's shapes; padded columns, a bias
        weight = (torch.randn(n, k, generator=gen) * 0.05).bfloat16()
        bias = torch.randn(n, generator=gen).bfloat16() if with_bias else None
        probe = Linear(weight, None, True, tmp_path, helpers)
        if probe._amx != kernel_modes.BF16_TILES:
            pytest.skip("no AMX here (or no C compiler)")
        for m, row in ((1, 0), (17, 16), (32, 5)):
            x, w = _amplified(torch.randn(m, k, generator=gen).bfloat16(), weight, row, bias)
            lin = Linear(w, bias, True, tmp_path, helpers)
            torch.set_num_threads(2)  # what transformers runs with here
            ref = F.linear(x, w, bias)
            torch.set_num_threads(1)
            out = lin(x)
            assert torch.equal(out, ref) and out[row].count_nonzero() > n // 2  # the low bits are there, and equal
            residual = torch.randn(m, n, generator=gen).bfloat16()
            assert torch.equal(lin(x, residual), residual + ref)
        x = torch.randn(ROW_TILE + 21, 576, generator=gen).bfloat16()
        lin = Linear((torch.randn(n, 576, generator=gen) * 0.05).bfloat16(), None, True, tmp_path, helpers)
        full = lin(x)
        for m in (1, 15, 16, 17, 40, ROW_TILE + 21):
            assert torch.equal(lin(x[:m]), full[:m]) and torch.equal(lin(x[m - 1 : m]), full[m - 1 : m])


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "BF16", "F16"])
def test_weight_rows_read_back_the_dequantized_blocks(qtype: str, tmp_path: Path) -> None:
    """A tied embedding's rows come from its lm_head's panels: every row, the padded last panel's too, in any order
    and repeated, equals gguf-py's dequantized row bit for bit; a projection of several types' runs as well."""
    k = 512
    blocks = make_blocks(qtype, 200, k, seed=3)
    lin = Linear(None, None, True, tmp_path, blocks=blocks)
    if lin.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here: the engine dequantizes the blocks for torch")
    assert lin.reads_blocks
    index = torch.cat((torch.randperm(200, generator=torch.Generator().manual_seed(1)), torch.tensor([199, 0, 199])))
    assert torch.equal(lin.weight_rows(index), blocks.dequantize()[index])
    mixed = GGUFBlocks.cat([make_blocks("Q8_0", 48, k, 4), blocks])
    lin = Linear(None, None, True, tmp_path, blocks=mixed)
    assert torch.equal(lin.weight_rows(torch.arange(248).flip(0)), mixed.dequantize().flip(0))


@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx512vbmi", "-mno-gfni")], ids=["avx2", "avx512-rows"])
@pytest.mark.slow  # compiles the C libraries again for another target (tens of seconds on 2 cores)
def test_weight_rows_in_the_other_builds(
    flags: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows read back the same in the library built for AVX2 CPUs and for AVX-512 without VBMI and GFNI."""
    if Linear(None, None, True, tmp_path, blocks=make_blocks("Q8_0", 16, 64)).kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here")
    monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, *flags])
    monkeypatch.delitem(native._loaded, "gemm", raising=False)
    monkeypatch.setattr(gemm_library, "_lib", None)
    mixed = GGUFBlocks.cat([make_blocks(t, 32, 512, i) for i, t in enumerate(("Q4_1", "Q5_0", "Q6_K", "F16"))])
    lin = Linear(None, None, True, tmp_path, blocks=mixed)
    assert torch.equal(lin.weight_rows(torch.arange(128).flip(0)), mixed.dequantize().flip(0))
    monkeypatch.delitem(native._loaded, "gemm")


def test_weight_rows_refuse_ids_outside_the_weight(tmp_path: Path) -> None:
    """Token ids into the tied embedding's lookup: the kernel reads row `id` of the panels unchecked, so an id
    outside the vocabulary is a StepInputError before the call."""
    lin = Linear(None, None, True, tmp_path, blocks=make_blocks("Q8_0", 200, 64, seed=3))
    if lin.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here: the engine dequantizes the blocks for torch")
    assert lin.weight_rows(torch.tensor([0, 199])).shape == (2, 64)
    for bad in (200, -1):
        with pytest.raises(StepInputError, match=f"token id {bad} is outside the vocabulary \\(0 .. 199\\)"):
            lin.weight_rows(torch.tensor([5, bad, 7]))
