"""The norms and activations of the dense layers on the C kernels (DenseOps) against transformers' and torch's
bits: RMSNorm (alone, per head, with the residual add), SiLU and GELU-tanh and multiply, the logit soft-cap and
Granite's multipliers, alone and shared with a helper thread."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engines.pytorch import dense_ops, gemm_library, native
from engines.pytorch.dense_ops import DenseOps
from engines.pytorch.layers.norms import RMSNorm
from engines.pytorch.native import HelperThreads

pytestmark = pytest.mark.usefixtures("one_torch_thread")


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
