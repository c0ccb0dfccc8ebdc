"""LoRA adapters on the native engine's projections, rows of many adapters and of the base model in one step.

Every row of a step goes through the base projection together (one GEMM, the base model's kernels and bits); then,
for each group of rows that run under the same adapter, the low-rank update `(x @ A.T) @ B.T * scale` is added to
those rows' outputs, in torch ops, as PEFT's unmerged LoRA layer computes it (`result + lora_B(lora_A(x)) *
scaling`). A fused projection (q/k/v, gate/up) updates all its parts in the same two matmuls (`SlotUpdate`: the
parts' A stacked, their B block-diagonal, each column's scale: four torch ops per group and projection however many
parts); gate and up are updated before the activation (`GatedActivation.gate_up`, then `activate`), and o and down
add their update before the residual, as transformers adds the residual to PEFT's output. Rows of the base model are
computed as in a step without adapters, bit for bit.

The projections are wrapped once, when the first adapter is loaded (`install`): a model that never serves an adapter
keeps its plain projections. The runner names the step's groups for the thread that computes it (`step_groups`);
outside such a step a wrapper calls its projection as it is.

In a float32 model with the C kernels, the updates of every group run as one C call per projection instead
(lora_kernel.py, csrc/lora.c): each adapter holds a slot in every projection's slot table, and the step hands the
kernel each row's slot (`StepAdapters.slots`), -1 for the base model's rows; gate/up's update reads the fused job's
raw product in its panel order. The torch ops above remain for the other models (bfloat16, torch's projections).

With the C kernel, decode steps that carry adapter rows are recorded and replayed too (model_runner.py,
step_replay.py: plans of their own, each row's slot a per-step input); on the torch path they run from Python.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engines.pytorch import lora_kernel
from engines.pytorch.layers.mlp import GatedMLP
from engines.pytorch.lora_kernel import KernelUpdate
from engines.pytorch.lora_weights import LoRAWeights, SlotUpdate

_step = threading.local()  # .adapters: the StepAdapters of the step the calling thread computes


@dataclass
class RowGroup:
    """The rows of a step that run under one adapter: a slice where they are consecutive, else their indices."""

    rows: slice | torch.Tensor
    adapter: LoRAWeights


def row_groups(spans: dict[int, list[tuple[int, int]]], adapters: dict[int, LoRAWeights]) -> list[RowGroup]:
    """The groups of a step from each adapter's row spans (first, end); `adapters` by id."""
    groups = []
    for adapter_id, found in spans.items():
        if len(found) == 1:
            rows: slice | torch.Tensor = slice(*found[0])
        else:
            rows = torch.cat([torch.arange(a, e) for a, e in found])
        groups.append(RowGroup(rows, adapters[adapter_id]))
    return groups


@dataclass
class StepAdapters:
    """A step's adapter rows: their groups (the torch path; they also keep the adapters' tensors alive through the
    step), and with the C kernel each row's slot (int32, -1 for a row of the base model) and the kernel library."""

    groups: list[RowGroup]
    slots: torch.Tensor | None = None
    lib: Any = None


@contextlib.contextmanager
def step_groups(step: StepAdapters | list[RowGroup] | None) -> Iterator[None]:
    """Within it, the calling thread's projections add the updates of `step`'s rows (None: none; a list: groups on
    the torch path)."""
    saved = getattr(_step, "adapters", None)
    _step.adapters = StepAdapters(step) if isinstance(step, list) else step
    try:
        yield
    finally:
        _step.adapters = saved


class _Updated:
    """Projection `name` of layer `layer`, whose output columns [start, end) are module `module`'s (`parts`), with the
    updates of the step's adapter rows added. Everything else about it is its projection's (`__getattr__`)."""

    def __init__(self, base: Any, layer: int, name: str, parts: Sequence[tuple[str, int, int]]) -> None:
        self.base, self.layer, self.name, self.parts = base, layer, name, tuple(parts)
        self.table: torch.Tensor | None = None  # the slot table, with the C kernel (lora_kernel.py)

    def __getattr__(self, name: str) -> Any:
        if name in ("base", "layer", "name", "parts", "table"):
            raise AttributeError(name)
        return getattr(self.base, name)

    def prepare(self, adapter: LoRAWeights, kernel: bool = False) -> None:
        """`adapter`'s update of this projection as one `SlotUpdate`, or with `kernel` as a `KernelUpdate` (none where
        it updates no part of it)."""
        pairs = adapter.layers[self.layer]
        present = [(pairs[m], start, end) for m, start, end in self.parts if m in pairs]
        if not present:
            return
        if kernel:
            adapter.slots[(self.layer, self.name)] = KernelUpdate.of(present)
            return
        first = present[0][0]
        width = max(end for _, _, end in self.parts)
        rank = sum(pair.a.shape[0] for pair, _, _ in present)
        b = first.b.new_zeros(width, rank)
        scale = first.b.new_zeros(width)
        offset = 0
        for pair, start, end in present:
            r = pair.a.shape[0]
            b[start:end, offset : offset + r] = pair.b
            scale[start:end] = pair.scale
            offset += r
        a = torch.cat([pair.a for pair, _, _ in present]).contiguous()
        adapter.slots[(self.layer, self.name)] = SlotUpdate(a, b, scale)

    def _add(self, y: torch.Tensor, x: torch.Tensor, groups: list[RowGroup]) -> torch.Tensor:
        for group in groups:
            update = group.adapter.slots.get((self.layer, self.name))
            if not isinstance(update, SlotUpdate):
                continue
            # PEFT's lora_B(lora_A(x)) * scaling, every part of a fused projection at once
            delta = F.linear(F.linear(x[group.rows], update.a), update.b) * update.scale
            if isinstance(group.rows, slice):
                y[group.rows] += delta
            else:
                y.index_add_(0, group.rows, delta)
        return y


class LoRALinear(_Updated):
    """A `Linear` with adapter updates (q/k/v, o, down)."""

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, prompt_from: int | None = None
    ) -> torch.Tensor:
        step = getattr(_step, "adapters", None)
        if step is None or not step.groups:
            return self.base(x, residual, prompt_from=prompt_from)
        y = self.base(x, prompt_from=prompt_from)
        table = self.table  # read once: an adapter added meanwhile may replace it with a larger copy
        if step.slots is not None and table is not None:  # every group in one call, the residual add after
            return lora_kernel.apply(step.lib, table, x, y, step.slots, residual)
        y = self._add(y, x, step.groups)
        return y if residual is None else residual + y  # the projection's residual add, after the update


class LoRAGated(_Updated):
    """A `GatedActivation` with adapter updates of gate and up, added before the activation."""

    def __call__(self, x: torch.Tensor, prompt_from: int | None = None) -> torch.Tensor:
        step = getattr(_step, "adapters", None)
        if step is None or not step.groups:
            return self.base(x, prompt_from=prompt_from)
        table = self.table
        if step.slots is not None and table is not None:
            y, panels = self.base.gate_up_panels(x, prompt_from=prompt_from)
            width = self.base.out_features if panels else 0
            return self.base.activate(lora_kernel.apply(step.lib, table, x, y, step.slots, None, width))
        return self.base.activate(self._add(self.base.gate_up(x, prompt_from=prompt_from), x, step.groups))


def projection_shapes(model: Any) -> list[dict[str, tuple[int, int]]]:
    """Per layer of a `DecoderModel`, each module an adapter may update and its (out, in): the attention's always,
    the MLP's where it is a dense gated MLP (a mixture of experts takes none)."""
    shapes = []
    for layer in model.layers:
        attn = layer.attn
        hidden = attn.o.out_features
        q, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
        found = {
            "q_proj": (q, hidden),
            "k_proj": (kv, hidden),
            "v_proj": (kv, hidden),
            "qkv_proj": (q + 2 * kv, hidden),
            "o_proj": (hidden, q),
        }
        if isinstance(layer.mlp, GatedMLP):
            n = layer.mlp.gate_up_act.out_features
            found.update(
                {
                    "gate_proj": (n, hidden),
                    "up_proj": (n, hidden),
                    "gate_up_proj": (2 * n, hidden),
                    "down_proj": (hidden, n),
                }
            )
        shapes.append(found)
    return shapes


def wrapped(model: Any) -> list[_Updated]:
    """The model's projections that adapters update (after `install`)."""
    return [
        p
        for layer in model.layers
        for p in (
            layer.attn.qkv,
            layer.attn.o,
            getattr(layer.mlp, "gate_up_act", None),
            getattr(layer.mlp, "down", None),
        )
        if isinstance(p, _Updated)
    ]


def prepare(model: Any, adapter: LoRAWeights, kernel: bool = False) -> None:
    """`adapter.slots`: its update of each of the model's (wrapped) projections (`kernel`: in the C kernel's form);
    then its per-module pairs go."""
    for projection in wrapped(model):
        projection.prepare(adapter, kernel)
    adapter.layers = [{} for _ in adapter.layers]


def install(model: Any, slots: lora_kernel.Slots | None = None) -> None:
    """Wrap every projection of a `DecoderModel` that adapters update (once; the model's own calls stay the same),
    with a slot table each where the updates run on the C kernel (`slots`)."""
    for i, layer in enumerate(model.layers):
        attn = layer.attn
        if isinstance(attn.qkv, LoRALinear):
            continue
        hidden = attn.o.out_features
        q, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
        attn.qkv = LoRALinear(
            attn.qkv,
            i,
            "qkv",
            (("q_proj", 0, q), ("k_proj", q, q + kv), ("v_proj", q + kv, q + 2 * kv), ("qkv_proj", 0, q + 2 * kv)),
        )
        attn.o = LoRALinear(attn.o, i, "o", (("o_proj", 0, hidden),))
        mlp = layer.mlp
        if isinstance(mlp, GatedMLP):
            n = mlp.gate_up_act.out_features
            mlp.gate_up_act = LoRAGated(
                mlp.gate_up_act, i, "gate_up", (("gate_proj", 0, n), ("up_proj", n, 2 * n), ("gate_up_proj", 0, 2 * n))
            )
            mlp.down = LoRALinear(mlp.down, i, "down", (("down_proj", 0, hidden),))
    if slots is not None:
        for projection in wrapped(model):
            if projection.table is None:
                projection.table = slots.table()
