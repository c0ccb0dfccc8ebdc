"""gpt-oss's parts against transformers' modules: the MoE block (biased router, softmax of the top-k logits, biased
experts around the clamped SwiGLU, gate and up interleaved in the checkpoint) with the clamps reached, and the
rotary tables (transformers' half-width ones, widened) rotating as transformers rotates. The whole model against
transformers is tests/engines/pytorch/test_families.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.pytorch.layers.projections import Kernels
from engines.pytorch.layers.rotary import fold_sin
from engines.pytorch.linear import DenseOps
from engines.pytorch.models.gpt_oss import _FullWidthTables, _moe
from engines.pytorch.paged_attention import rotate
from tests.family_models import GPT_OSS_YARN

HIDDEN = 64


@pytest.fixture(scope="module")
def tmp_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One kernel cache for the module."""
    return tmp_path_factory.mktemp("kernels")


def _config():
    from transformers import GptOssConfig

    return GptOssConfig(
        hidden_size=HIDDEN,
        intermediate_size=32,
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
