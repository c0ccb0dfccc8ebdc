"""The native engine's step (engines/pytorch/engine.py): a step that carries a request with a seed keeps its decode
rows off the tile unit (kernel_modes.decode_rows_on_registers), so that request's tokens do not depend on its batch."""

from __future__ import annotations

import torch

from engines.pytorch import kernel_modes
from engines.pytorch.engine import PyTorchEngine
from engines.torch_threads import TorchThreads
from engines.types import EngineInfo, SamplingParams, SequenceStep


class _Runner:
    """Stands in for the model runner: logits that pick token 3 for every row, and whether each forward ran with
    the decode rows held on the register kernels and with int8 activations."""

    def __init__(self) -> None:
        self.pinned: list[bool] = []
        self.int8: list[bool] = []

    def forward(self, batch: list[SequenceStep]) -> torch.Tensor:
        self.pinned.append(kernel_modes.decode_rows_pinned())
        self.int8.append(kernel_modes.activations_int8())
        logits = torch.zeros(len(batch), 8)
        logits[:, 3] = 1.0
        return logits


def _engine() -> tuple[PyTorchEngine, _Runner]:
    engine = PyTorchEngine.__new__(PyTorchEngine)  # no model: the step's policy only
    runner = _Runner()
    engine._runner, engine._argmax, engine._generators, engine._int8 = runner, None, {}, False
    engine._info = EngineInfo("fake", "float32", 64, 8, [0], 16, 64, 1)
    engine.torch_threads = TorchThreads(torch.get_num_threads())
    return engine, runner


def _rows(n: int, seeded: int | None) -> list[SequenceStep]:
    rows = []
    for i in range(n):
        params = SamplingParams(temperature=0.8, max_tokens=4, seed=7 if i == seeded else None)
        rows.append(SequenceStep(f"s{i}", [1], 4, [i], True, params, [1, 2, 3, 4, 1], 4, 1))
    return rows


def test_a_step_with_a_seeded_request_keeps_decode_rows_off_the_tile_unit() -> None:
    engine, runner = _engine()
    engine.execute(_rows(24, seeded=None))
    engine.execute(_rows(24, seeded=17))
    engine.execute(_rows(3, seeded=0))
    assert runner.pinned == [False, True, True]
    assert not kernel_modes.decode_rows_pinned()  # only for the step


def test_an_engine_with_int8_activations_steps_in_that_arithmetic() -> None:
    engine, runner = _engine()
    engine.execute(_rows(2, seeded=None))
    engine._int8 = True
    engine.execute(_rows(2, seeded=None))
    assert runner.int8 == [False, True]
    assert not kernel_modes.activations_int8()  # only for the step
