"""The LoRA C kernel (engines/pytorch/lora_kernel.py, csrc/lora.c) against PEFT's update in torch ops: rows of several
adapters (ranks 1 to 16, fused projections with a rank per part, parts leaving columns untouched) and of the base
model in one call, the residual added after the update, gate/up's panel layout, on the helper threads; rows of the
base model keep their bits. The AVX2 and scalar builds in the slow lane."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engines.pytorch import lora_kernel, native
from engines.pytorch.lora_kernel import KernelUpdate, Slots
from engines.pytorch.lora_weights import LoRAPair
from engines.pytorch.native import HelperThreads

K, N = 72, 100  # neither a multiple of 16: the vector loops' tails


class _Projection:
    def __init__(self, slots: Slots) -> None:
        self.layer, self.name, self.table = 0, "p", slots.table()


class _Adapter:
    def __init__(self, update: KernelUpdate | None) -> None:
        self.slots = {} if update is None else {(0, "p"): update}


def _pairs(parts: list[tuple[int, int, int]], seed: int) -> list[tuple[LoRAPair, int, int]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            LoRAPair(
                torch.randn(r, K, generator=gen) * 0.1,
                torch.randn(end - start, r, generator=gen) * 0.1,
                2.0 if r % 2 == 0 else 0.5,
            ),
            start,
            end,
        )
        for r, start, end in parts
    ]


def _reference(x: torch.Tensor, y: torch.Tensor, rows: list[list[tuple[LoRAPair, int, int]] | None]) -> torch.Tensor:
    out = y.clone()
    for m, present in enumerate(rows):
        for pair, start, end in present or []:
            out[m, start:end] += F.linear(F.linear(x[m : m + 1], pair.a), pair.b)[0] * pair.scale
    return out


def _case(tmp_path: Path, helpers: HelperThreads | None = None) -> tuple:
    lib = lora_kernel.library(tmp_path, helpers)
    if lib is None:
        pytest.skip("no C compiler here: the torch path runs the updates")
    slots = Slots(lib)
    projection = _Projection(slots)
    adapters = {
        1: _pairs([(4, 0, 40), (8, 40, 70), (2, 70, 100)], 1),  # q/k/v-like, a rank per part
        2: _pairs([(16, 10, 100)], 2),  # columns 0-9 untouched
        3: _pairs([(1, 0, 100)], 3),
        4: None,  # an adapter that updates no part of this projection
    }
    for i, present in adapters.items():
        slots.add(i, _Adapter(KernelUpdate.of(present) if present else None), [projection])
    return lib, slots, projection, adapters


@pytest.mark.parametrize("rows", [3, 37])  # 37: past SHARE_ROWS, on the pool
@pytest.mark.parametrize("threads", [0, 2])
def test_every_row_gets_its_adapters_update_and_base_rows_keep_their_bits(
    rows: int, threads: int, tmp_path: Path
) -> None:
    lib, slots, projection, adapters = _case(tmp_path, HelperThreads(threads, tmp_path) if threads else None)
    gen = torch.Generator().manual_seed(rows)
    ids = [[0, 1, 2, 3, 4][i % 5] for i in range(rows)]
    x, y = torch.randn(rows, K, generator=gen), torch.randn(rows, N, generator=gen)
    row_slots = torch.tensor([slots.of(i) if i else -1 for i in ids], dtype=torch.int32)
    expect = _reference(x, y, [adapters[i] if i else None for i in ids])
    out = lora_kernel.apply(lib, projection.table, x, y.clone(), row_slots)
    torch.testing.assert_close(out, expect, atol=1e-6, rtol=1e-6)
    for m, i in enumerate(ids):
        if i in (0, 4):
            assert torch.equal(out[m], y[m]), m
    assert torch.equal(
        out[[m for m, i in enumerate(ids) if i == 2], :10], y[[m for m, i in enumerate(ids) if i == 2], :10]
    )
    residual = torch.randn(rows, N, generator=gen)
    added = lora_kernel.apply(lib, projection.table, x, y.clone(), row_slots, residual)
    assert torch.equal(added, residual + out)  # the update first, then the residual (transformers' order)


def test_gate_up_panels_are_read_in_their_layout(tmp_path: Path) -> None:
    lib, slots, projection, adapters = _case(tmp_path)
    n = N // 2  # 50 intermediate columns: 4 panels, the last one partial
    gen = torch.Generator().manual_seed(7)
    x, plain = torch.randn(5, K, generator=gen), torch.randn(5, 2 * n, generator=gen)
    panels = torch.full((5, 4, 2, 16), float("nan"))  # padding columns must not be read
    for h in range(2):
        padded = torch.full((5, 64), float("nan"))
        padded[:, :n] = plain[:, h * n : (h + 1) * n]
        panels[:, :, h] = padded.view(5, 4, 16)
    ids = [1, 0, 2, 3, 0]
    row_slots = torch.tensor([slots.of(i) if i else -1 for i in ids], dtype=torch.int32)
    out = lora_kernel.apply(lib, projection.table, x, panels.view(5, 128), row_slots, None, n)
    expect = _reference(x, plain, [adapters[i] if i else None for i in ids])
    torch.testing.assert_close(out, expect, atol=1e-6, rtol=1e-6)
    assert torch.equal(out[[1, 4]], plain[[1, 4]])


def test_a_removed_adapters_slot_is_reused_only_after_the_next_steps_start(tmp_path: Path) -> None:
    _, slots, projection, _ = _case(tmp_path)
    slot = slots.of(2)
    entry = projection.table[slot].clone()
    slots.release(2)
    assert slots.of(2) == slot and torch.equal(projection.table[slot], entry)  # a running step still reads it
    slots.recycle([projection])
    assert not projection.table[slot].any()
    update = KernelUpdate.of(_pairs([(3, 0, 100)], 9))
    slots.add(9, _Adapter(update), [projection])
    assert slots.of(9) == slot
    for i in range(10, 20):  # past the first capacity: the table grows, the entries kept
        slots.add(i, _Adapter(None), [projection])
    assert projection.table.shape[0] > lora_kernel.FIRST_CAPACITY
    assert projection.table[slots.of(9)].tolist() == update.words()


# slow lane: compiles the library again for another target
@pytest.mark.slow
@pytest.mark.parametrize("flags", [("-mno-avx512f",), ("-mno-avx2", "-mno-fma")], ids=["avx2", "scalar"])
def test_the_other_builds_update_as_the_reference(
    flags: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, *flags])
    monkeypatch.delitem(native._loaded, "lora", raising=False)
    try:
        test_every_row_gets_its_adapters_update_and_base_rows_keep_their_bits(37, 0, tmp_path)
        test_gate_up_panels_are_read_in_their_layout(tmp_path)
    finally:
        native._loaded.pop("lora", None)
