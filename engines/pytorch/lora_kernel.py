"""LoRA updates of a float32 model's projections as one C call per projection and step (csrc/lora.c), rows of every
adapter and of the base model together, punica / S-LoRA style.

Why: the torch path (lora.py `_Updated._add`) runs four torch ops per adapter group and projection, so a step
mixing 8 adapters costs over a hundred ops per layer on the interpreter. Here each loaded adapter holds a slot
(`Slots`): in every wrapped projection's slot table (int64 words, SLOT_WORDS a slot) the slot's entry points to the
adapter's own tensors, its parts' A stacked and each part's B transposed with its output columns and scale (a
fused projection, q/k/v or gate/up, has a part per module the adapter updates, as `SlotUpdate` stacks them). A
step passes each row's slot (-1 for a row of the base model) and the kernel applies every row's update at once.

Slots are taken when an adapter is added (any thread, under a lock) and given back at the start of the step after
its removal (`release`, then `recycle` on the step's thread): a step that began with the adapter keeps reading its
entry. A table that runs out of slots is replaced by a larger copy; the wrapper reads its table once per call,
which keeps the old one alive through that call.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engines.pytorch.native import HelperThreads, Signatures, load_library

_p, _i64, _i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# csrc/lora.c
SIGNATURES: Signatures = {
    "lora_slot_words": (_i32, []),
    "lora_max_parts": (_i32, []),
    # x, ldx, y, ldy, panels, out, ldo, residual, ldr, M, K, N, slots, table, capacity
    "lora_apply_f32": (_i32, [_p, _i64, _p, _i64, _i32, _p, _i64, _p, _i64, _i32, _i32, _i32, _p, _p, _i32]),
    "set_pool": (None, [_p]),
}
# the per-step input of lora_apply_f32 a replayed plan patches (step_replay.py): each row's slot
STEP_ARGS = {"lora_apply_f32": {"lora_slots": 12}}
S_A, S_RANK, S_PARTS, S_PART0, MAX_PARTS, SLOT_WORDS = 0, 1, 2, 3, 4, 32
P_WORDS = 6
FIRST_CAPACITY = 8


def library(cache_dir: Path | None, helpers: HelperThreads | None) -> ctypes.CDLL | None:
    """csrc/lora.c built for this CPU, on the helper threads where there are some (None without a compiler)."""
    lib = load_library("lora", cache_dir, SIGNATURES)
    if lib is None or lib.lora_slot_words() != SLOT_WORDS or lib.lora_max_parts() != MAX_PARTS:
        return None
    if helpers is not None:
        helpers.attach(lib)
    return lib


@dataclass
class KernelUpdate:
    """An adapter's update of one projection in the kernel's form: its parts' A stacked ([sum r, in]) and per part
    (first column, end column, rank offset, rank, B transposed [r, end - first], scale)."""

    a: torch.Tensor
    parts: list[tuple[int, int, int, int, torch.Tensor, float]]

    def words(self) -> list[int]:
        out = [self.a.data_ptr(), self.a.shape[0], len(self.parts)]
        for start, end, roff, r, bt, scale in self.parts:
            out += [start, end, roff, r, bt.data_ptr(), struct.unpack("<I", struct.pack("<f", scale))[0]]
        return out + [0] * (SLOT_WORDS - len(out))

    @classmethod
    def of(cls, present: list[tuple[Any, int, int]]) -> KernelUpdate:
        """From a projection's (LoRAPair, first column, end column) per part the adapter updates."""
        parts, roff = [], 0
        for pair, start, end in present:
            r = pair.a.shape[0]
            parts.append((start, end, roff, r, pair.b.t().float().contiguous(), float(pair.scale)))
            roff += r
        return cls(torch.cat([pair.a for pair, _, _ in present]).float().contiguous(), parts)


class Slots:
    """Which slot each loaded adapter holds, and the slot tables of a model's wrapped projections (lora.py)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self._lock = threading.Lock()
        self._of: dict[int, int] = {}  # adapter id -> slot
        self._held: dict[int, Any] = {}  # slot -> the adapter whose tensors its entries point to
        self._free: list[int] = []
        # removed adapters' (id, slot): a step that began before the removal still reads them; free from the next
        self._released: list[tuple[int, int]] = []
        self._capacity = FIRST_CAPACITY
        self.generation = 0  # bumped when the tables grow (replayed plans point to them)
        self._retired: list[torch.Tensor] = []  # tables replaced by larger ones: a running step may still read them

    def table(self) -> torch.Tensor:
        """A new projection's empty table."""
        return torch.zeros(self._capacity, SLOT_WORDS, dtype=torch.int64)

    def add(self, adapter_id: int, adapter: Any, projections: list[Any]) -> None:
        """Give `adapter` a slot and write its entry into every projection's table (`projection.table`, replaced by a
        larger copy when full)."""
        with self._lock:
            if self._free:
                slot = self._free.pop()
            else:
                slot = len(self._held)  # every slot below it is held (none is free)
                if slot >= self._capacity:
                    self._capacity *= 2
                    for projection in projections:
                        grown = self.table()
                        grown[: projection.table.shape[0]] = projection.table
                        self._retired.append(projection.table)
                        projection.table = grown
                    self.generation += 1
            for projection in projections:
                update = adapter.slots.get((projection.layer, projection.name))
                if isinstance(update, KernelUpdate):
                    projection.table[slot] = torch.tensor(update.words(), dtype=torch.int64)
                else:
                    projection.table[slot] = 0
            self._held[slot] = adapter
            self._of[adapter_id] = slot

    def release(self, adapter_id: int) -> None:
        """The adapter is gone; its slot is reused from the step after the next `recycle`."""
        with self._lock:
            slot = self._of.get(adapter_id)
            if slot is not None and (adapter_id, slot) not in self._released:
                self._released.append((adapter_id, slot))

    def recycle(self, projections: list[Any]) -> None:
        """At a step's start (its thread): the slots released before it are free; no step reads them any more."""
        if not self._released:
            return
        with self._lock:
            for adapter_id, slot in self._released:
                for projection in projections:
                    projection.table[slot] = 0
                del self._held[slot], self._of[adapter_id]
                self._free.append(slot)
            self._released.clear()

    def of(self, adapter_id: int) -> int:
        """The adapter's slot (still, after its removal, for the step that began before it)."""
        with self._lock:
            return self._of[adapter_id]


def apply(
    lib: ctypes.CDLL,
    table: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    slots: torch.Tensor,
    residual: torch.Tensor | None = None,
    panels: int = 0,
) -> torch.Tensor:
    """y with each row's update added (in place), then the residual; with `panels` (y gate_up's raw product,
    `panels` intermediate columns) a new [rows, 2 x panels] tensor in [gate | up] order."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    m, k = x.shape
    n = 2 * panels if panels else y.shape[1]
    out = y.new_empty(m, n) if panels else y
    rc = lib.lora_apply_f32(
        x.data_ptr(),
        x.stride(0),
        y.data_ptr(),
        y.stride(0),
        int(bool(panels)),
        out.data_ptr(),
        out.stride(0),
        None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0),
        m,
        k,
        n,
        slots.data_ptr(),
        table.data_ptr(),
        table.shape[0],
    )
    if rc != 0:
        raise MemoryError("the LoRA kernel could not allocate its scratch")
    return out
