"""The packed GEMM kernel against F.linear: shapes, bias, residual epilogue, strided input, batch invariance."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engines.interface import StepInputError
from engines.pytorch import dense_ops, gemm_library, kernel_modes, native, packed_blocks
from engines.pytorch.dense_ops import DenseOps
from engines.pytorch.gated_activation import GatedActivation
from engines.pytorch.gguf_blocks import GGUFBlocks
from engines.pytorch.kernel_modes import CHUNK_PANELS, ROW_TILE
from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.linear import Linear
from engines.pytorch.native import HelperThreads
from tests.random_gguf_blocks import make_blocks


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernel is single-threaded; the engine uses it with one torch thread
    yield
    torch.set_num_threads(threads)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_kernel_gives_transformers_bits(dtype: torch.dtype, tmp_path: Path) -> None:
    """The mean's sum runs in torch's order, so the kernel's RMSNorm is transformers' bit for bit (alone and shared
    with a helper thread; widths with and without a tail of vectors and of scalars)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator().manual_seed(19)
    alone, shared = DenseOps(True, dtype, tmp_path), DenseOps(True, dtype, tmp_path, HelperThreads(2, tmp_path))
    if not alone.uses_kernel:
        pytest.skip("no C compiler or no AVX2/FMA here")
    for h in (576, 100, 8200):
        norm = LlamaRMSNorm(h, eps=1e-5).to(dtype)
        with torch.no_grad():
            norm.weight.copy_(torch.rand(h, generator=gen) * 2)
        x = (torch.randn(300, h, generator=gen) * 3).to(dtype)
        ref = norm(x)
        assert torch.equal(alone.rms_norm(norm, x), ref) and torch.equal(shared.rms_norm(norm, x), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_head_rms_norm_on_the_kernel_gives_transformers_bits(dtype: torch.dtype, tmp_path: Path) -> None:
    """q/k norms over each head of a view of the qkv projection (Qwen3's, Gemma 3's with its 1 + w scale): one
    kernel call a row on decode-sized steps, transformers' module beyond; its bits either way."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    from engines.pytorch.layers.norms import RMSNorm

    ops = DenseOps(True, dtype, tmp_path)
    if not ops.uses_kernel:
        pytest.skip("no C compiler or no AVX2/FMA here")
    gen = torch.Generator().manual_seed(23)
    for d in (32, 128, 256):
        for module, unit_offset in ((Qwen3RMSNorm(d, eps=1e-6), False), (Gemma3RMSNorm(d, eps=1e-6), True)):
            with torch.no_grad():
                module.weight.copy_(torch.randn(d, generator=gen) * 0.3)
            norm = RMSNorm(module.to(dtype), unit_offset)
            for rows in (1, 7, dense_ops.HEAD_NORM_KERNEL_ROWS + 1):
                qkv = torch.randn(rows, 20 * d, generator=gen).to(dtype)
                q = qkv[:, : 16 * d].view(rows, 16, d)
                assert torch.equal(ops.rms_norm_heads(norm, q), module(q)), (d, type(module).__name__, rows)


def test_bfloat16_silu_mul_kernel_gives_transformers_bits(tmp_path: Path) -> None:
    """act(gate) * up in bfloat16 as torch computes it (its exp_u20 in the vector loop, libm's expf in the tail),
    alone and shared: every bfloat16 value as the gate (NaN, infinities and values past exp's range included; an
    exp within a few ulp of torch's misses about 15000 of them), in rows with and without a tail."""
    gen = torch.Generator().manual_seed(23)
    alone = DenseOps(True, torch.bfloat16, tmp_path)
    shared = DenseOps(True, torch.bfloat16, tmp_path, HelperThreads(2, tmp_path))
    if not alone.uses_kernel:
        pytest.skip("no C compiler or no AVX2/FMA here")
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    for i in (1024, 1000):  # 64 rows of whole 64-element blocks; 66 rows with a tail of 40
        gate = torch.cat([every, every.new_zeros(-every.numel() % i)]).view(-1, i)
        up = (torch.randn(gate.shape, generator=gen) * 2).bfloat16()
        ref = torch.nn.SiLU()(gate) * up
        for ops in (alone, shared):
            out = ops.act_mul(torch.nn.SiLU(), torch.cat([gate, up], dim=1))
            assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.nan_to_num(), ref.nan_to_num())


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_gate_up_silu_gives_the_bits_of_the_two_steps(threads: int, tmp_path: Path) -> None:
    """The fused MLP input (gate and up panels in turn, activated per tile) equals the concatenated projection then
    act_mul bit for bit: one row, a few, past ROW_TILE; an intermediate size that is not a multiple of 16."""
    gen = torch.Generator().manual_seed(11)
    gate, up = (torch.randn(200, 64, generator=gen) * 0.1 for _ in range(2))
    helpers = HelperThreads(threads, tmp_path) if threads > 1 else None
    dense = DenseOps(True, torch.float32, tmp_path, helpers)
    fused = GatedActivation(gate, up, torch.nn.SiLU(), True, tmp_path, helpers, dense)
    two_steps = Linear(torch.cat([gate, up]), None, True, tmp_path, helpers)
    if two_steps.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here")
    for m in (1, 5, 300):
        x = torch.randn(m, 64, generator=gen)
        out = fused(x)
        assert out.shape == (m, 200)
        assert torch.equal(out, dense.act_mul(torch.nn.SiLU(), two_steps(x)))
        torch.testing.assert_close(out, F.silu(F.linear(x, gate)) * F.linear(x, up), atol=1e-5, rtol=1e-4)
    unfused = GatedActivation(gate, up, torch.nn.GELU(), True, tmp_path, helpers, dense)  # not SiLU: the two steps
    torch.testing.assert_close(unfused(x), F.gelu(F.linear(x, gate)) * F.linear(x, up), atol=1e-5, rtol=1e-4)


def test_decode_rows_go_to_the_tile_unit_only_in_large_steps_prompt_rows_always() -> None:
    packed = packed_blocks._Packed([(1, 2, torch.zeros(1, 320, dtype=torch.uint8))], 32, tile_unit=True)
    big = kernel_modes.TILE_UNIT_MIN_ROWS + 1
    assert packed.row_parts(40, 5) == [(0, 5, 0), (5, 40, 1)]  # a few decode rows, then prompt rows
    assert packed.row_parts(40, None) == [(0, 40, 1)] and packed.row_parts(big + 3, big) == [(0, big + 3, 1)]
    assert packed.row_parts(10, None) == [(0, 10, 0)] and packed.row_parts(10, 10) == [(0, 10, 0)]
    assert packed.row_parts(12, 0) == [(0, 12, 1)]  # a prefill alone
    off = packed_blocks._Packed([(1, 2, torch.zeros(1, 320, dtype=torch.uint8))], 32, tile_unit=False)
    assert off.row_parts(40, 5) == [(0, 40, 0)]


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


@pytest.mark.parametrize("threads", [1, 2])
def test_tile_unit_fused_gate_up_equals_the_two_steps(threads: int, tmp_path: Path) -> None:
    """The fused MLP input gives the bits of the concatenated projection then act_mul, on the tile unit (large steps)
    and off it."""
    gen = torch.Generator().manual_seed(13)
    helpers = HelperThreads(threads, tmp_path) if threads > 1 else None
    gate, up = (make_blocks("Q4_1", 200, 64, seed=s) for s in (1, 2))
    dense = DenseOps(True, torch.float32, tmp_path, helpers)
    fused = GatedActivation(
        gate.dequantize(), up.dequantize(), torch.nn.SiLU(), True, tmp_path, helpers, dense, (gate, up)
    )
    two_steps = Linear(
        torch.cat([gate.dequantize(), up.dequantize()]), None, True, tmp_path, helpers, GGUFBlocks.cat([gate, up])
    )
    if not _tile_unit(two_steps):
        pytest.skip("no AMX here (or no C compiler)")
    for m in (1, 8, 16, 300):
        x = torch.randn(m, 64, generator=gen)
        assert torch.equal(fused(x), dense.act_mul(torch.nn.SiLU(), two_steps(x)))


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


def test_decode_rows_stay_on_the_register_kernels_when_asked() -> None:
    """Forced path (any CPU: the split is decided in Python): a weight whose panels use the tile unit sends more
    than 16 decode rows there, except inside `decode_rows_on_registers` (a step with a seeded request), where every
    decode row keeps the register kernels' bits whatever the batch; prompt rows use the tile unit either way, and
    another thread's steps are not affected."""
    packed = packed_blocks._Packed([], 64, tile_unit=True)
    assert packed.row_parts(24, None) == [(0, 24, 1)]
    assert packed.row_parts(40, 24) == [(0, 40, 1)]
    assert packed.row_parts(8, None) == [(0, 8, 0)]
    with kernel_modes.decode_rows_on_registers():
        assert packed.row_parts(24, None) == [(0, 24, 0)]
        assert packed.row_parts(40, 24) == [(0, 24, 0), (24, 40, 1)]
        elsewhere: list[list[tuple[int, int, int]]] = []
        thread = threading.Thread(target=lambda: elsewhere.append(packed.row_parts(24, None)))
        thread.start()
        thread.join()
        assert elsewhere == [[(0, 24, 1)]]
    assert packed.row_parts(24, None) == [(0, 24, 1)]


@pytest.mark.parametrize(
    "build",
    ["default", pytest.param("avx2", marks=pytest.mark.slow)],  # avx2: compiles gemm.c again (seconds)
)
def test_gemma_layer_kernels(build: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels that keep Gemma-like layers on C (step_replay.py replays only kernels): a block's output norm with
    the residual add, and per-head q/k norms of the qkv projection's view, give transformers' bits; the final logit
    soft-cap and GELU-tanh-and-multiply are within a few ulp of torch's tanh; alone and shared with a helper thread
    the same bits; rows with and without a tail of vectors; in this CPU's build and the AVX2 one."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    if build == "avx2":
        monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, "-mno-avx512f"])
        monkeypatch.delitem(native._loaded, "gemm", raising=False)
        monkeypatch.setattr(gemm_library, "_lib", None)
    gen = torch.Generator().manual_seed(29)
    alone = DenseOps(True, torch.float32, tmp_path)
    shared = DenseOps(True, torch.float32, tmp_path, HelperThreads(2, tmp_path))
    if not alone.uses_kernel:
        pytest.skip("no C compiler or no AVX2/FMA here")
    for h in (576, 100):
        hf = Gemma3RMSNorm(h, eps=1e-6)
        with torch.no_grad():
            hf.weight.copy_(torch.randn(h, generator=gen))
        norm = RMSNorm(hf, unit_offset=True)
        x, residual = torch.randn(300, h, generator=gen) * 3, torch.randn(300, h, generator=gen)
        ref = residual + hf(x)
        assert torch.equal(alone.rms_norm_add(norm, x, residual), ref)
        assert torch.equal(shared.rms_norm_add(norm, x, residual), ref)
    for d, module in ((16, Qwen3RMSNorm(16, eps=1e-6)), (72, Gemma3RMSNorm(72, eps=1e-6))):
        with torch.no_grad():
            module.weight.copy_(torch.randn(d, generator=gen))
        norm = RMSNorm(module, unit_offset=isinstance(module, Gemma3RMSNorm))
        qkv = torch.randn(50, 8 * d, generator=gen) * 2
        q = qkv[:, : 4 * d].view(50, 4, d)  # rows 8 * d apart, heads d apart
        ref = module(q)
        assert torch.equal(alone.rms_norm_heads(norm, q), ref) and torch.equal(shared.rms_norm_heads(norm, q), ref)
    logits = torch.cat([torch.randn(200, 1003, generator=gen) * 40, torch.linspace(-1, 1, 1003)[None] * 4])
    ref = torch.tanh(logits / 30.0) * 30.0
    capped = [ops.softcap(logits.clone(), 30.0) for ops in (alone, shared)]
    assert torch.equal(capped[0], capped[1])
    torch.testing.assert_close(capped[0], ref, atol=3e-6, rtol=2e-6)
    gelu = torch.nn.GELU(approximate="tanh")
    act = type("GELUTanh", (torch.nn.Module,), {"forward": lambda self, v: gelu(v)})()
    act.act = functools.partial(F.gelu, approximate="tanh")
    gate_up = torch.randn(300, 2 * 1003, generator=gen) * 3
    ref = F.gelu(gate_up[:, :1003], approximate="tanh") * gate_up[:, 1003:]
    out = alone.act_mul(act, gate_up)
    assert torch.equal(out, shared.act_mul(act, gate_up))
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize(
    "build",
    ["default", pytest.param("avx2", marks=pytest.mark.slow)],  # avx2: compiles gemm.c again (seconds)
)
def test_granite_multiplier_kernels(build: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Granite's residual multiplier with the residual add after it, and its logits' division, give torch's bits
    (`residual + out * multiplier`: the product rounded first; `logits / scaling`: a true division, which a divisor
    that is not a power of two tells from a multiplication by its reciprocal); alone and shared with a helper thread,
    rows with and without a tail of vectors, in this CPU's build and the AVX2 one."""
    if build == "avx2":
        monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, "-mno-avx512f"])
        monkeypatch.delitem(native._loaded, "gemm", raising=False)
        monkeypatch.setattr(gemm_library, "_lib", None)
    gen = torch.Generator().manual_seed(31)
    alone = DenseOps(True, torch.float32, tmp_path)
    shared = DenseOps(True, torch.float32, tmp_path, HelperThreads(2, tmp_path))
    if not alone.uses_kernel:
        pytest.skip("no C compiler or no AVX2/FMA here")
    for h in (576, 100):
        out, residual = torch.randn(300, h, generator=gen) * 3, torch.randn(300, h, generator=gen)
        ref = residual + out * 0.22
        assert not torch.equal(ref, (residual.double() + out.double() * 0.22).float())  # one rounding differs
        assert torch.equal(alone.scale_add(out, 0.22, residual), ref)
        assert torch.equal(shared.scale_add(out, 0.22, residual), ref)
    logits = torch.randn(200, 1003, generator=gen) * 40
    ref = logits / 7.3
    assert not torch.equal(ref, logits * (1 / 7.3))
    for ops in (alone, shared):
        assert torch.equal(ops.divide(logits.clone(), 7.3), ref)
