"""The gated MLP input (GatedActivation): the fused gate-up-SiLU job gives the bits of the concatenated projection
then act_mul, on the register kernels and on the tile unit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engines.pytorch.dense_ops import DenseOps
from engines.pytorch.gated_activation import GatedActivation
from engines.pytorch.gguf_blocks import GGUFBlocks
from engines.pytorch.linear import Linear
from engines.pytorch.native import HelperThreads
from tests.random_gguf_blocks import make_blocks

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tile_unit(lin: Linear | GatedActivation) -> bool:
    return lin._blocks is not None and lin._blocks.tile_unit


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
