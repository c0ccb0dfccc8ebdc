"""The GEMM kernel reading GGUF blocks gives, for every type, the float32 kernel's bits on the dequantized weight: in
registers (steps of up to 16 rows) and through its scratch (larger steps), alone and with helper threads, a fused
projection whose parts have different types, the fused gate/up with SiLU; with AVX-512 (4 k rows at once with VBMI
and GFNI, row by row without), and with AVX2 only. The weights the kernels expand are gguf-py's dequantization bit for
bit on each of those builds (MXFP4's table lookup too, at its subnormal and large scales)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.pytorch import gemm_library, kernel_modes, native
from engines.pytorch.dense_ops import DenseOps
from engines.pytorch.gated_activation import GatedActivation
from engines.pytorch.gguf_blocks import TYPES, GGUFBlocks
from engines.pytorch.linear import Linear
from engines.pytorch.native import HelperThreads
from tests.random_gguf_blocks import K_QUANTS, make_blocks

ROWS = (1, 3, 16, 17, 32, 200)


@pytest.fixture(autouse=True)
def _register_kernels(monkeypatch: pytest.MonkeyPatch):
    """One torch thread (as the engine runs) and the register kernels also on CPUs with the tile unit."""
    monkeypatch.setattr(kernel_modes, "TILE_UNIT", False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _helpers(threads: int, cache: Path) -> HelperThreads | None:
    return HelperThreads(threads, cache) if threads > 1 else None


def _check(blocks: GGUFBlocks, threads: int, cache: Path, gen: torch.Generator, rows=ROWS) -> None:
    weight = blocks.dequantize()
    n, k = weight.shape
    bias = torch.randn(n, generator=gen)
    helpers = _helpers(threads, cache)
    plain, from_blocks = Linear(weight, bias, True, cache, helpers), Linear(None, bias, True, cache, helpers, blocks)
    if from_blocks.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here: the engine dequantizes the blocks for torch")
    assert from_blocks.weight is None and from_blocks.blocks_nbytes > 0  # no float32 copy kept
    for m in rows:
        x, residual = torch.randn(m, k, generator=gen), torch.randn(m, n, generator=gen)
        out = from_blocks(x)
        assert torch.equal(out, plain(x)), (blocks.qtype, k, m, threads)
        assert torch.equal(from_blocks(x, residual), plain(x, residual))
    torch.testing.assert_close(out, torch.nn.functional.linear(x, weight, bias), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("qtype", sorted(TYPES))
def test_blocks_give_the_float32_kernels_bits(qtype: str, threads: int, tmp_path: Path) -> None:
    """SmolLM2's widths (576, 1536; a K-quant needs whole 256-weight super-blocks, so 1536 only), 216 output columns
    (a padded last panel, an odd number of panels)."""
    gen = torch.Generator().manual_seed(threads)
    for k in (1536,) if qtype in K_QUANTS else (576, 1536):
        _check(make_blocks(qtype, 216, k, seed=k), threads, tmp_path, gen)


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_projections_of_one_type_and_of_several(threads: int, tmp_path: Path) -> None:
    """q/k/v as a Q4_K_M file has them (q, k one type, v another: runs of panels of each type) and of one type; gate
    and up with SiLU in one job (their panels in turn), as from the concatenated projection then act_mul."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = make_blocks("Q4_K", 64, 512, 1), make_blocks("Q4_K", 32, 512, 2), make_blocks("Q6_K", 32, 512, 3)
    _check(GGUFBlocks.cat([q, k, v]), threads, tmp_path, gen)
    _check(
        GGUFBlocks.cat([make_blocks("Q8_0", 48, 576, 4), make_blocks("Q5_0", 40, 576, 5)]),
        threads,
        tmp_path,
        gen,
        rows=(1, 17),
    )
    _check(GGUFBlocks.cat([q, k]), threads, tmp_path, gen, rows=(1, 17))
    helpers = _helpers(threads, tmp_path)
    dense = DenseOps(True, torch.float32, tmp_path, helpers)
    for qtype in ("Q5_0", "BF16", "Q6_K"):
        gate, up = make_blocks(qtype, 200, 512, 6), make_blocks(qtype, 200, 512, 7)
        fused = GatedActivation(None, None, torch.nn.SiLU(), True, tmp_path, helpers, dense, (gate, up))
        two_steps = Linear(torch.cat([gate.dequantize(), up.dequantize()]), None, True, tmp_path, helpers)
        assert fused.weight is None and fused.blocks_nbytes > 0
        for m in (1, 16, 17, 200):
            x = torch.randn(m, 512, generator=gen)
            assert torch.equal(fused(x), dense.act_mul(torch.nn.SiLU(), two_steps(x))), (qtype, m)
    mixed = GatedActivation(
        None,
        None,
        torch.nn.SiLU(),
        True,
        tmp_path,
        helpers,
        dense,
        (make_blocks("Q4_K", 64, 512, 8), make_blocks("Q6_K", 64, 512, 9)),
    )
    x = torch.randn(5, 512, generator=gen)
    reference = torch.nn.functional.linear(
        x, torch.cat([make_blocks("Q4_K", 64, 512, 8).dequantize(), make_blocks("Q6_K", 64, 512, 9).dequantize()])
    )
    torch.testing.assert_close(mixed(x), dense.act_mul(torch.nn.SiLU(), reference), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("qtype", sorted(TYPES))
def test_the_kernels_expand_the_blocks_to_gguf_pys_weights(qtype: str, tmp_path: Path) -> None:
    """Rows read back through the kernels' expansion (`weight_rows`: what a tied embedding reads, the code the GEMM
    expands panels with) are gguf-py's dequantization, bit for bit, the rows of a padded last panel included."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    blocks = make_blocks(qtype, 40, 512, seed=2)
    lin = Linear(None, None, True, tmp_path, None, blocks)
    if lin.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here")
    theirs = dequantize(blocks.raw.numpy(), GGMLQuantizationType[qtype]).reshape(40, 512)
    assert torch.equal(lin.weight_rows(torch.arange(40)), torch.from_numpy(theirs))


def _mxfp4_extremes(n: int, k: int, seed: int) -> GGUFBlocks:
    """MXFP4 blocks of gguf-py's quantizer with their scale bytes replaced: ggml's subnormal scales (e 0, 1), the
    smallest normal one, and large ones (the products stay finite at these widths)."""
    gen = torch.Generator().manual_seed(seed)
    raw = make_blocks("MXFP4", n, k, seed).raw.view(n, k // 32, 17).clone()
    scales = torch.tensor([0, 1, 2, 64, 127, 150], dtype=torch.uint8)
    raw[..., 0] = scales[torch.randint(0, len(scales), (n, k // 32), generator=gen)]
    return GGUFBlocks("MXFP4", raw.view(n, -1))


@pytest.mark.parametrize("threads", [1, 2])
def test_mxfp4_extreme_scales_give_the_float32_kernels_bits(threads: int, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(6)
    blocks = _mxfp4_extremes(216, 576, 7)
    weight = blocks.dequantize()
    helpers = _helpers(threads, tmp_path)
    plain = Linear(weight, None, True, tmp_path, helpers)
    from_blocks = Linear(None, None, True, tmp_path, helpers, blocks)
    if from_blocks.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here")
    assert torch.equal(from_blocks.weight_rows(torch.arange(216)), weight)
    for m in ROWS:
        x = torch.randn(m, 576, generator=gen)
        assert torch.equal(from_blocks(x), plain(x)), m


def test_without_the_kernel_the_blocks_are_dequantized(tmp_path: Path) -> None:
    blocks = make_blocks("Q4_K", 32, 256)
    lin = Linear(None, None, False, tmp_path, None, blocks)
    assert lin.kind == "torch" and torch.equal(lin.weight, blocks.dequantize())


# slow lane: compiles the C libraries again for another target (tens of seconds on 2 cores)
@pytest.mark.slow
@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx512vbmi", "-mno-gfni")], ids=["avx2", "avx512-rows"])
def test_the_other_builds_give_the_same_bits(
    flags: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library built without AVX-512 (the 256-bit paths: AVX2 CPUs), or with AVX-512 but without VBMI and GFNI
    (Skylake-X, Cascade Lake: the blocks expanded row by row instead of 4 k rows at once), reads the blocks to the
    same bits as this CPU's build of the float32 kernel; it has no int8 kernels, so `int8_activations` changes
    nothing there."""
    gen = torch.Generator().manual_seed(5)
    cases = [make_blocks(t, 40, 512, i) for i, t in enumerate(sorted(TYPES))] + [_mxfp4_extremes(40, 512, 9)]
    xs = {m: torch.randn(m, 512, generator=gen) for m in (1, 2, 3, 20)}
    native_plain = [Linear(b.dequantize(), None, True, tmp_path) for b in cases]
    if native_plain[0].kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here")
    expected = [{m: plain(x) for m, x in xs.items()} for plain in native_plain]
    monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, *flags])
    monkeypatch.delitem(native._loaded, "gemm", raising=False)
    monkeypatch.setattr(gemm_library, "_lib", None)
    assert not kernel_modes.int8_available(tmp_path)
    for b, want in zip(cases, expected, strict=True):
        other = Linear(None, None, True, tmp_path, _helpers(2, tmp_path), b)
        assert other.kind == "kernel"
        assert torch.equal(other.weight_rows(torch.arange(40)), b.dequantize()), b.qtype  # gguf-py's weights
        for m, x in xs.items():
            assert torch.equal(other(x), want[m]), (b.qtype, m)
            with kernel_modes.int8_activations():
                assert torch.equal(other(x), want[m]), (b.qtype, m)
    monkeypatch.delitem(native._loaded, "gemm")
