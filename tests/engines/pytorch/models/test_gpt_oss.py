"""gpt-oss's parts against transformers' modules: the MoE block (biased router, softmax of the top-k logits, biased
experts around the clamped SwiGLU, gate and up interleaved in the checkpoint) with the clamps reached, its fused C
call (csrc/moe.c) against the Python block on this CPU's build, the AVX2 one and the scalar one, and the rotary
tables (transformers' half-width ones, widened) rotating as transformers rotates. The whole model against
transformers is tests/engines/pytorch/test_families.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.pytorch import gemm_library, native
from engines.pytorch.dense_ops import DenseOps
from engines.pytorch.layers.moe import SparseMoE
from engines.pytorch.layers.projections import Kernels
from engines.pytorch.layers.rotary import fold_sin
from engines.pytorch.models.gpt_oss import _FullWidthTables, _moe
from engines.pytorch.paged_attention import rotate
from tests.family_models import GPT_OSS_YARN

HIDDEN = 64


@pytest.fixture(scope="module")
def tmp_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One kernel cache for the module."""
    return tmp_path_factory.mktemp("kernels")


def _config(intermediate: int = 32):
    from transformers import GptOssConfig

    return GptOssConfig(
        hidden_size=HIDDEN,
        intermediate_size=intermediate,
        num_local_experts=6,
        num_experts_per_tok=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_hidden_layers=2,
        max_position_embeddings=256,
        rope_parameters=dict(GPT_OSS_YARN),
    )


@pytest.mark.parametrize("fast", [True, False], ids=["kernels", "torch"])
def test_moe_block_equals_transformers(fast: bool, tmp_path: Path) -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = _config()
    block = GptOssMLP(config).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))  # large enough for gate and up to pass the clamps
    ours = _moe(block, config, Kernels(fast, tmp_path, None, DenseOps(fast, torch.float32, tmp_path)))
    if fast and ours.router.kind == "kernel":
        assert ours.fused is not None  # everything after the router in one C call: what the step replay records
    x = torch.randn(17, HIDDEN, generator=gen)
    with torch.no_grad():
        gate_up = x @ block.experts.gate_up_proj[0] + block.experts.gate_up_proj_bias[0]
        assert float(gate_up.abs().max()) > 2 * config.swiglu_limit  # the clamps are reached
        want, _ = block(x[None])
        _, want_weights, want_experts = block.router(x)
    weights, experts = ours.route(x)
    assert torch.equal(experts, want_experts)
    torch.testing.assert_close(weights, want_weights, rtol=1e-6, atol=1e-6)
    residual = torch.randn(17, HIDDEN, generator=gen)
    torch.testing.assert_close(ours(x), want[0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ours(x, residual, prompt_from=5), residual + want[0], rtol=1e-5, atol=1e-4)


# another target's build compiles the C libraries again: slow lane, as in the MoE layer's tests
BUILDS = ["native", pytest.param("avx2", marks=pytest.mark.slow), pytest.param("scalar", marks=pytest.mark.slow)]


@pytest.fixture
def build(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """csrc/moe.c built for a CPU without AVX-512 (gemm.c too), or without AVX2 (moe.c's scalar loops; its
    projections stay on this CPU's gemm.c, which needs AVX2). monkeypatch puts this CPU's builds back."""
    if request.param == "scalar":
        gemm_library._load(tmp_path)  # gemm.c as this CPU's build, before the flags change
    if request.param != "native":
        flags = ["-mno-avx512f"] if request.param == "avx2" else ["-mno-avx2", "-mno-fma"]
        monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, *flags])
        keep = () if request.param == "avx2" else ("gemm",)
        monkeypatch.setattr(native, "_loaded", {k: v for k, v in native._loaded.items() if k in keep})
        if request.param == "avx2":
            monkeypatch.setattr(gemm_library, "_lib", None)
    return request.param


@pytest.mark.parametrize("build", BUILDS, indirect=True)
def test_fused_block_is_the_python_block_beyond_the_clamps(build: str, tmp_path: Path) -> None:
    """The fused call (biased gate-up, the clamped SwiGLU in C, biased down, top-k-then-softmax routing) against the
    same projections in the Python block (the clamps and the sigmoid in torch ops): the same experts, outputs within
    the last bits of the sigmoid's exp, with gate and up far past the clamps both ways (gates low enough that torch's
    exp(-t) overflows) and an expert width that leaves a tail of every vector width (36); and against transformers."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = _config(36)
    block = GptOssMLP(config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
        block.experts.gate_up_proj.mul_(3)
    ours = _moe(block, config, Kernels(True, tmp_path, None, DenseOps(True, torch.float32, tmp_path)))
    if ours.router.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here: the engine uses torch's projections")
    assert ours.fused is not None
    python = SparseMoE(ours.router, ours.experts, ours.routing)
    for rows, prompt_from in ((1, None), (3, 3), (17, 5)):
        x = torch.randn(rows, HIDDEN, generator=gen)
        residual = torch.randn(rows, HIDDEN, generator=gen)
        with torch.no_grad():
            mlp = block.experts
            gate_up = torch.stack([x @ w + b for w, b in zip(mlp.gate_up_proj, mlp.gate_up_proj_bias, strict=True)])
            want, _ = block(x[None])
            _, want_weights, want_experts = block.router(x)
        if rows == 17:
            gate, up = gate_up[..., 0::2], gate_up[..., 1::2]
            limit = config.swiglu_limit
            assert gate.max() > limit and up.max() > limit and up.min() < -limit
            assert gate.min() * config.swiglu_alpha < -89  # torch's exp(-t) is infinite there, the sigmoid 0
        weights, experts = ours.route(x)
        assert torch.equal(experts, want_experts) and torch.equal(python.route(x)[1], experts)
        torch.testing.assert_close(weights, python.route(x)[0], rtol=4e-6, atol=0)
        torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-7)  # the router's logits: last bits
        fused = ours(x, residual, prompt_from)
        torch.testing.assert_close(fused, python(x, residual, prompt_from), rtol=2e-6, atol=2e-5)
        torch.testing.assert_close(fused, residual + want[0], rtol=1e-5, atol=2e-4)
        for i in range(rows):  # a row's bits do not depend on the rest of the step
            assert torch.equal(ours(x[i : i + 1], residual[i : i + 1], 1), fused[i : i + 1])


def test_rotary_tables_rotate_as_transformers() -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding, apply_rotary_pos_emb

    module = GptOssRotaryEmbedding(_config())
    tables = _FullWidthTables(module)
    assert tables.rope_type == "yarn"
    positions = torch.arange(100)
    q, k = torch.randn(100, 4, 32), torch.randn(100, 2, 32)
    cos_half, sin_half = module(q, positions[None])
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos_half, sin_half)
    cos, sin = tables(q, positions[None])
    sin = fold_sin(sin[0])
    assert torch.equal(rotate(q, cos[0][:, None], sin[:, None]), want_q[0].transpose(0, 1))
    assert torch.equal(rotate(k, cos[0][:, None], sin[:, None]), want_k[0].transpose(0, 1))
