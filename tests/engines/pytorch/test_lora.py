"""LoRA updates on the projections (engines/pytorch/lora.py): each group of rows gets its adapter's update, as PEFT's
unmerged layer computes it (to float32 rounding: a fused projection's parts are updated in one pair of matmuls), and
the base model's rows keep the bits of a step without adapters."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engines.pytorch.dense_ops import DenseOps
from engines.pytorch.gated_activation import GatedActivation
from engines.pytorch.linear import Linear
from engines.pytorch.lora import LoRAGated, LoRALinear, RowGroup, _Updated, row_groups, step_groups
from engines.pytorch.lora_weights import LoRAPair, LoRAWeights
from tests.random_gguf_blocks import make_blocks


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _adapter(
    projection: _Updated, modules: dict[str, tuple[int, int]], rank: int, seed: int, scale: float = 0.5
) -> tuple[LoRAWeights, dict[str, LoRAPair]]:
    """An adapter of `modules` prepared for `projection`, and its pairs."""
    gen = torch.Generator().manual_seed(seed)
    pairs = {
        name: LoRAPair(torch.randn(rank, k, generator=gen) * 0.1, torch.randn(n, rank, generator=gen) * 0.1, scale)
        for name, (n, k) in modules.items()
    }
    adapter = LoRAWeights([dict(pairs)], "test", rank)
    projection.prepare(adapter)
    return adapter, pairs


def _update(x: torch.Tensor, pair: LoRAPair) -> torch.Tensor:
    return F.linear(F.linear(x, pair.a), pair.b) * pair.scale  # PEFT's lora_B(lora_A(x)) * scaling


@pytest.mark.parametrize("fast", [True, False])
def test_each_group_gets_its_adapters_update_and_base_rows_keep_their_bits(fast: bool, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(3)
    q, kv, hidden = 48, 16, 40
    weight = torch.randn(q + 2 * kv, hidden, generator=gen) * 0.1
    base = Linear(weight, None, fast, tmp_path)
    qkv = LoRALinear(base, 0, "qkv", (("q_proj", 0, q), ("k_proj", q, q + kv), ("v_proj", q + kv, q + 2 * kv)))
    one, one_pairs = _adapter(qkv, {"q_proj": (q, hidden), "v_proj": (kv, hidden)}, 4, 1)  # k untouched
    two, two_pairs = _adapter(qkv, {"k_proj": (kv, hidden)}, 8, 2, scale=2.0)
    x = torch.randn(9, hidden, generator=gen)
    plain = base(x)
    assert torch.equal(qkv(x), plain)  # outside a step with adapters: the projection as it is
    # rows 0-1 base, 2-3 and 7 adapter one (not consecutive), 4-6 adapter two, 8 base
    groups = row_groups({1: [(2, 4), (7, 8)], 2: [(4, 7)]}, {1: one, 2: two})
    with step_groups(groups):
        out = qkv(x)
    for rows in ([0, 1], [8]):
        assert torch.equal(out[rows], plain[rows])
    expect = plain.clone()
    rows_one = [2, 3, 7]
    expect[rows_one, :q] += _update(x[rows_one], one_pairs["q_proj"])
    expect[rows_one, q + kv :] += _update(x[rows_one], one_pairs["v_proj"])
    expect[4:7, q : q + kv] += _update(x[4:7], two_pairs["k_proj"])
    torch.testing.assert_close(out, expect, atol=1e-6, rtol=1e-6)
    assert torch.equal(out[rows_one, q : q + kv], plain[rows_one, q : q + kv])  # k: no update, the same bits


def test_the_residual_is_added_after_the_update(tmp_path: Path) -> None:
    """transformers adds the residual to PEFT's output (base + update); the kernel's fused residual add would
    round base + residual first."""
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(32, 24, generator=gen) * 0.1
    base = Linear(weight, None, True, tmp_path)
    o = LoRALinear(base, 0, "o", (("o_proj", 0, 32),))
    adapter, pairs = _adapter(o, {"o_proj": (32, 24)}, 4, 7)
    x, residual = torch.randn(3, 24, generator=gen), torch.randn(3, 32, generator=gen)
    with step_groups([RowGroup(slice(1, 3), adapter)]):
        out = o(x, residual)
    expect = base(x)
    expect[1:3] += _update(x[1:3], pairs["o_proj"])
    assert torch.equal(out, residual + expect)  # one module: PEFT's very ops
    assert torch.equal(out[0], base(x, residual)[0])  # a base row: the fused add's bits


@pytest.mark.parametrize("blocks", [False, True], ids=["float32", "gguf-blocks"])
def test_gate_and_up_are_updated_before_the_activation(blocks: bool, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(9)
    n, k = 200, 64  # not a multiple of 16: padded panels
    dense = DenseOps(True, torch.float32, tmp_path)
    if blocks:
        gate_blocks, up_blocks = make_blocks("Q8_0", n, k, 1), make_blocks("Q8_0", n, k, 2)
        gate, up = gate_blocks.dequantize(), up_blocks.dequantize()
        fused = GatedActivation(None, None, torch.nn.SiLU(), True, tmp_path, None, dense, (gate_blocks, up_blocks))
    else:
        gate, up = (torch.randn(n, k, generator=gen) * 0.1 for _ in range(2))
        fused = GatedActivation(gate, up, torch.nn.SiLU(), True, tmp_path, None, dense)
    two_steps = Linear(torch.cat([gate, up]), None, True, tmp_path)
    x = torch.randn(5, k, generator=gen)
    if two_steps.kind == "kernel":  # the raw products are the fused job's, bit for bit
        assert torch.equal(fused.gate_up(x), two_steps(x))
        assert torch.equal(fused.activate(fused.gate_up(x)), fused(x))
    torch.testing.assert_close(
        fused.gate_up(x), torch.cat([F.linear(x, gate), F.linear(x, up)], 1), atol=1e-5, rtol=1e-4
    )
    mlp_in = LoRAGated(fused, 0, "gate_up", (("gate_proj", 0, n), ("up_proj", n, 2 * n)))
    adapter, pairs = _adapter(mlp_in, {"gate_proj": (n, k), "up_proj": (n, k)}, 4, 3)
    with step_groups([RowGroup(slice(0, 2), adapter)]):
        out = mlp_in(x)
    g = F.linear(x[:2], gate) + _update(x[:2], pairs["gate_proj"])
    u = F.linear(x[:2], up) + _update(x[:2], pairs["up_proj"])
    torch.testing.assert_close(out[:2], F.silu(g) * u, atol=1e-5, rtol=1e-4)
    assert torch.equal(out[2:], fused(x)[2:])
