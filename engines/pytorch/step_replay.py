"""Decode steps replayed in one C call: no Python between a step's kernels.

A decode step of M rows runs the same kernel calls every time (per layer: RMSNorm, the qkv projection, the decode
attention, the o projection with the residual, RMSNorm, gate-up-SiLU, the down projection with the residual; then the
final norm and the lm_head): only the attention's inputs (rotary cos and sin, block tables, context lengths), the
embeddings and the logits change. Driven from Python, each call costs its ctypes conversion, a tensor allocation and
the interpreter between calls: about a fifth of a batch-1 step here, with the helper threads idling meanwhile
(bench/step_profile.py). A speculative verification step (one sequence's last token and k proposed ones) is, to
the kernels, a decode step of k + 1 rows (the decode attention writes every row's key and value before any row
attends, so row j sees rows 0 .. j - 1): plans are keyed by the number of rows, whoever the rows belong to.

So the first decode-only step of M rows runs the Python forward while recording every call into the C kernels
(function, arguments) and, through a torch dispatch mode, every tensor the forward allocates; any torch op that
computes (instead of allocating or viewing) makes M unreplayable (a model or mode the C kernels do not cover
alone). The recorded temporaries are packed into one arena by their lifetimes (first to last call that touches
them), and the calls are rewritten to point into it: a few KB per row. From then on a step of M rows copies its
embeddings into the arena, patches the attention's per-step arguments and the logits' address, and hands the whole
list to `replay_run` (csrc/step_replay.c), which calls the same functions with the same arguments in the same
order: the same bits. The second step of M rows checks that: it runs both the Python forward and the replay (the
attention's cache writes are the same values twice) and keeps the replay only if the logits are equal bit for bit.

Decode steps with LoRA adapter rows have plans of their own (`_key`): the LoRA kernel's calls (csrc/lora.c, added
with `add_library`) read each row's adapter slot from a per-step input, patched at every replay like the attention's
block tables (`step_args`).

Greedy rows take their tokens right after, from the logits just written (still in cache): one pass that is both the
argmax and the check that every logit is finite (csrc/argmax.c `argmax_rows_finite_f32`), so the sampler does not
read the logits again; a verification step's proposals are accepted from those argmaxes (sampler.accept_greedy).
"""

from __future__ import annotations

import bisect
import ctypes
import logging
import platform
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engines.pytorch import argmax as argmax_module
from engines.pytorch.kernel_modes import decode_rows_pinned
from engines.pytorch.native import Signatures, load_library

log = logging.getLogger("switchyard.engines.pytorch")

# csrc/step_replay.c
_SIGNATURES: Signatures = {
    "replay_words": (ctypes.c_int, []),
    "replay_run": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]),
}
INTS, FLOATS = 24, 8
W_FN, W_RETURNS_INT, W_RESET_FIRST, W_RESET_COUNT, W_INTS = 0, 1, 2, 3, 4
W_FLOATS = W_INTS + INTS
WORDS = W_FLOATS + FLOATS // 2
ENABLED = True  # read when a runner is built; benchmarks and tests turn it off to compare
MAX_PLANS = 64  # row counts with a plan (decode and verification steps of 1 .. max_num_seqs (k + 1) rows)
# The decode attention's per-step arguments (paged_attention.py's `decode` signature): cos, sin, tables,
# max_blocks, ctx_lens. A model with a rotary table per layer type (Gemma 3) passes each table's as "cos<name>" and
# "sin<name>": each attention call gets the pair it was recorded with.
ATTENTION_STEP_ARGS = {"cos": 6, "sin": 7, "tables": 10, "max_blocks": 11, "ctx_lens": 12}
_ROTARY = ("cos", "sin")
# torch ops a replayable forward may run between its kernels: allocations and views, no arithmetic.
_ALLOCATING = {"aten::empty.memory_format", "aten::new_empty", "aten::empty_strided", "aten::new_empty_strided"}
_VIEWING = {
    "aten::slice.Tensor",
    "aten::view",
    "aten::select.int",
    "aten::alias",
    "aten::detach",
    "aten::_unsafe_view",
    "aten::as_strided",
    "aten::unsqueeze",
    "aten::squeeze.dim",
    "aten::t",
    "aten::transpose.int",
    "aten::expand",
    "aten::reshape",
    "aten::lift_fresh",
}  # wraps memory torch did not allocate: the pointer check below decides


class _Unreplayable(Exception):
    """The forward did something the replay cannot repeat (a torch op that computes, an argument it cannot store)."""


class _Watch(TorchDispatchMode):
    """Keeps every tensor the forward allocates (so its address stays valid while the calls are recorded) and
    rejects ops that compute."""

    def __init__(self) -> None:
        super().__init__()
        self.allocated: list[torch.Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._schema.name  # aten::new_empty
        overload = f"{name}.{func._overloadname}" if func._overloadname != "default" else name
        if name in _ALLOCATING or overload in _ALLOCATING:
            self.allocated.append(out)
        elif name == "aten::to" and isinstance(out, torch.Tensor) and out.data_ptr() == args[0].data_ptr():
            pass  # .float() of a float32 tensor: itself
        elif name not in _VIEWING and overload not in _VIEWING:
            raise _Unreplayable(f"torch op {overload} between the kernels")
        return out


@dataclass
class _Call:
    fn: Any  # the ctypes function
    args: tuple
    keep: list = field(default_factory=list)  # ctypes objects passed by reference (their addresses are stored)
    resets: list = field(default_factory=list)  # (address, bytes before the call)


class _Patch:
    """One patched attribute: the original function, and how many active recorders rely on the wrapper."""

    def __init__(self, obj: Any, name: str, active: threading.local) -> None:
        self.original = fn = getattr(obj, name)
        self.users = 0

        def recording(*args: Any) -> Any:
            recorder = getattr(active, "recorder", None)
            if recorder is not None:
                recorder.record(fn, args)
            return fn(*args)

        setattr(obj, name, recording)


class _Recorder:
    """Records every call into the kernel libraries' functions (and Linear's captured entry points) that the
    recording thread makes, while it is active (a context manager).

    The libraries are shared: two models in one process load the same ctypes objects and step on their own threads,
    so a recording may overlap another model's steps or its recording. The attributes are patched once, by the
    first recorder active on them, with a wrapper that records only for the recorder of the calling thread (every
    other thread calls straight through); the last recorder to leave puts the functions back, whatever the order
    in which recordings end."""

    _lock = threading.Lock()
    # (id(obj), name) -> its wrapper, while any recorder uses it: shared by all recorders, like the libraries
    _patched: ClassVar[dict[tuple[int, str], _Patch]] = {}
    _active = threading.local()  # .recorder: the recorder of the calling thread, if it is recording

    def __init__(self, libs: list[Any], signatures: list[Signatures], holders: list[Any]) -> None:
        self.calls: list[_Call] = []
        self._targets: list[tuple[Any, str]] = []
        for lib, table in zip(libs, signatures, strict=True):
            self._targets.extend((lib, name) for name in table if name != "set_pool")
        for obj in holders:  # Linear keeps its float32 entry points as attributes
            self._targets.extend((obj, name) for name in ("_fn", "_par") if getattr(obj, name, None) is not None)

    def __enter__(self) -> _Recorder:
        if getattr(self._active, "recorder", None) is not None:
            raise RuntimeError("a thread records one step at a time")
        with self._lock:
            for obj, name in self._targets:
                patch = self._patched.get((id(obj), name))
                if patch is None:
                    patch = self._patched[(id(obj), name)] = _Patch(obj, name, self._active)
                patch.users += 1
        self._active.recorder = self
        return self

    def __exit__(self, *exc: object) -> None:
        self._active.recorder = None
        with self._lock:
            for obj, name in self._targets:
                patch = self._patched[(id(obj), name)]
                patch.users -= 1
                if not patch.users:
                    setattr(obj, name, patch.original)
                    del self._patched[(id(obj), name)]

    def record(self, fn: Any, args: tuple) -> None:
        call = _Call(fn, args)
        for a in args:
            target = getattr(a, "_obj", a)  # byref(x) -> x
            if isinstance(target, ctypes._SimpleCData | ctypes.Array | ctypes.Structure):
                call.keep.append(target)
                address = ctypes.addressof(target)
                call.resets.append((address, ctypes.string_at(address, ctypes.sizeof(target))))
        self.calls.append(call)


def _words(call: _Call) -> tuple[list[int], list[float]]:
    """A call's arguments as (integers and pointers, floats), in the order the System V ABI assigns them."""
    argtypes = call.fn.argtypes
    if argtypes is None or len(argtypes) != len(call.args):
        raise _Unreplayable(f"{call.fn.__name__}: no signature")
    ints: list[int] = []
    floats: list[float] = []
    for t, a in zip(argtypes, call.args, strict=True):
        if t is ctypes.c_float:
            floats.append(float(a))
        elif t is ctypes.c_double:
            raise _Unreplayable(f"{call.fn.__name__}: double argument")
        else:
            target = getattr(a, "_obj", a)
            if a is None:
                ints.append(0)
            elif isinstance(a, int):
                ints.append(a)
            elif isinstance(target, ctypes._SimpleCData | ctypes.Array | ctypes.Structure):
                ints.append(ctypes.addressof(target))
            else:
                raise _Unreplayable(f"{call.fn.__name__}: argument {a!r}")
    if len(ints) > INTS or len(floats) > FLOATS:
        raise _Unreplayable(f"{call.fn.__name__}: too many arguments")
    return ints, floats


def _long_lived(owners: list[Any]) -> list[tuple[int, int]]:
    """(start, end) of the memory every tensor (and numpy array) reachable from `owners` holds: the weights, caches
    and tables a runner keeps, which a recorded call may point to from one step to the next."""
    ranges, seen, stack = [], set(), list(owners)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, str | bytes | int | float | bool | type):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            ranges.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        elif isinstance(obj, np.ndarray):
            ranges.append((obj.ctypes.data, obj.ctypes.data + obj.nbytes))
        elif isinstance(obj, torch.nn.Module):
            stack.extend(obj.parameters())
            stack.extend(obj.buffers())
            stack.extend(v for v in vars(obj).values() if not isinstance(v, dict))
        elif isinstance(obj, list | tuple | set):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif type(obj).__module__.startswith("engines."):
            stack.extend(vars(obj).values() if hasattr(obj, "__dict__") else ())
            slots = (name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ()))
            stack.extend(getattr(obj, name, None) for name in slots)
    return sorted(ranges)


class _Plan:
    """The calls of a decode step of M rows, rewritten to point into the plan's arena."""

    def __init__(self) -> None:
        self.words: np.ndarray = np.zeros((0, WORDS), dtype=np.int64)
        self.resets: np.ndarray = np.zeros((1, 3), dtype=np.int64)
        self.keep: list[Any] = []
        self.arena: torch.Tensor | None = None
        self.hidden: torch.Tensor | None = None  # where the step's embeddings go
        self.logits_shape: tuple[int, ...] = ()
        self.logits_stride: tuple[int, ...] = ()
        self.logits_numel = 0
        self.logits_offset = 0  # elements
        self.logits_patch: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # rows, columns, byte offsets
        self.attention_rows: np.ndarray = np.zeros(0, dtype=np.int64)
        self.attention_rotary: dict[str, np.ndarray] = {}  # a rotary table's name suffix -> the calls using it
        self.step_args: list[tuple[str, np.ndarray, np.ndarray]] = []  # other per-step inputs: (name, calls, words)
        self.calls = 0
        self.validated = False


def _key(rows: int, adapters: bool) -> tuple[int, bool, bool]:
    """A plan's key: the step's rows, whether the calling thread's step keeps its decode rows off the tile unit
    (kernel_modes.decode_rows_on_registers), which changes the projections' calls, and whether the step has LoRA adapter
    rows (their updates are more calls: lora_kernel.py)."""
    return rows, decode_rows_pinned(), adapters


class StepReplay:
    """Replays decode-only steps of a runner (see the module's docstring). `run` returns None when a step is not
    (yet) replayed: the caller then runs its Python forward."""

    def __init__(
        self,
        cache_dir: Path | None,
        libs: list[ctypes.CDLL],
        signatures: list[Signatures],
        holders: list[Any],
        attention_fns: list[Any],
        owners: list[Any],
    ) -> None:
        """`libs`: the kernel libraries the forward calls (with their signature tables); `holders`: objects that
        keep entry points as attributes (Linear); `attention_fns`: the decode attention's entry points; `owners`:
        what holds the memory that lives from step to step (the runner: its weights and caches). A recorded call
        may point only into the step's own tensors, ctypes objects passed to it, the attention's per-step inputs and
        the owners' memory; anything else (a buffer made for one call and freed) leaves the steps on Python."""
        self._lib = load_library("step_replay", cache_dir, _SIGNATURES) if platform.machine() == "x86_64" else None
        if self._lib is not None and self._lib.replay_words() != WORDS:
            log.warning("step replay: csrc/step_replay.c's call layout differs from step_replay.py's; off")
            self._lib = None
        self._argmax = load_library("argmax", cache_dir, argmax_module._SIGNATURES)
        self._libs, self._signatures, self._holders, self._owners = libs, signatures, holders, owners
        self._attention = {ctypes.cast(f, ctypes.c_void_p).value for f in attention_fns}
        self._plans: dict[tuple[int, bool, bool], _Plan | None] = {}  # by _key
        self._step_args: dict[int, dict[str, int]] = {}  # function address -> {per-step input: argument position}
        self._greedy_out = torch.empty(0, dtype=torch.int64)

    @property
    def enabled(self) -> bool:
        return self._lib is not None

    def add_library(self, lib: ctypes.CDLL, signatures: Signatures, step_args: dict[str, dict[str, int]]) -> None:
        """Record calls into `lib` too (before any step calls it); `step_args`: per function, the arguments that are
        per-step inputs (by name in the step's inputs, patched at each replay like the attention's tables)."""
        if lib in self._libs:
            return
        for name, args in step_args.items():
            self._step_args[ctypes.cast(lib[name], ctypes.c_void_p).value or 0] = args
        self._signatures.append(signatures)
        self._libs.append(lib)

    def drop(self, adapters: bool) -> None:
        """Forget the plans of steps with (or without) adapter rows: what they point to moved."""
        for key in [k for k in self._plans if k[2] == adapters]:
            del self._plans[key]

    def plan_state(self, rows: int, adapters: bool = False) -> str:
        """'none' (not recorded yet), 'recorded', 'replayed' or 'off' (not replayable) for steps of `rows` rows
        (with adapter rows: `adapters`)."""
        if _key(rows, adapters) not in self._plans:
            return "none"
        plan = self._plans[_key(rows, adapters)]
        return "off" if plan is None else "replayed" if plan.validated else "recorded"

    # ------------------------------------------------------------------ recording

    def record(
        self,
        rows: int,
        forward: Callable[[torch.Tensor], torch.Tensor],
        hidden: torch.Tensor,
        step_inputs: dict[str, torch.Tensor],
        adapters: bool = False,
    ) -> torch.Tensor:
        """Run `forward(hidden)` (the Python layers and logits) while recording a plan for steps of `rows` rows."""
        recorder = _Recorder(self._libs, self._signatures, self._holders)
        watch = _Watch()
        failure = None
        try:
            with recorder, watch:
                logits = forward(hidden)
        except _Unreplayable as exc:
            failure = str(exc)
            logits = None
        if logits is None:  # the forward stopped at an op that computes: run it again, unwatched
            self._off(rows, adapters, failure)
            return forward(hidden)
        try:
            self._plans[_key(rows, adapters)] = self._build(
                recorder.calls, watch.allocated, hidden, logits, step_inputs
            )
        except _Unreplayable as exc:
            self._off(rows, adapters, str(exc))
        return logits

    def _off(self, rows: int, adapters: bool, why: str | None) -> None:
        if len(self._plans) < MAX_PLANS:
            self._plans[_key(rows, adapters)] = None
        log.info("native engine: decode steps of %d rows run from Python (%s)", rows, why)

    def _build(
        self,
        calls: list[_Call],
        allocated: list[torch.Tensor],
        hidden: torch.Tensor,
        logits: torch.Tensor,
        step_inputs: dict[str, torch.Tensor],
    ) -> _Plan:
        if not calls:
            raise _Unreplayable("no kernel calls")
        # regions: tensors whose addresses the calls hold; the logits' own region is given a new tensor every step
        regions: dict[int, tuple[int, torch.Tensor]] = {}  # base -> (bytes, tensor)
        for t in [hidden, *allocated]:
            size = t.untyped_storage().nbytes()
            base = t.untyped_storage().data_ptr()
            if size and base not in regions:
                regions[base] = (size, t)
        bases = sorted(regions)
        logits_base = logits.untyped_storage().data_ptr()
        if logits_base not in regions or logits.dtype != torch.float32:
            raise _Unreplayable("the logits are not a tensor of the step")
        hidden_base = hidden.untyped_storage().data_ptr()
        words_of = [_words(c) for c in calls]

        def region_of(ptr: int) -> int | None:
            i = bisect.bisect_right(bases, ptr) - 1
            if i >= 0 and ptr < bases[i] + regions[bases[i]][0]:
                return bases[i]
            return None

        # lifetimes: first and last call touching a region (the embeddings from before the first call)
        first: dict[int, int] = {hidden_base: -1}
        last: dict[int, int] = {hidden_base: 0}
        for i, (ints, _) in enumerate(words_of):
            for a in ints:
                r = region_of(a)
                if r is not None:
                    first.setdefault(r, i)
                    last[r] = i
        # pack the regions into an arena: greedy by first use, lowest offset that is free over the lifetime
        placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
        offset_of: dict[int, int] = {}
        for r in sorted((r for r in first if r != logits_base), key=lambda r: (first[r], r)):
            size = (regions[r][0] + 63) // 64 * 64
            busy = sorted((o, o + s) for o, s, f, last_use in placed if not (last_use < first[r] or f > last[r]))
            at = 0
            for lo, hi in busy:
                if at + size <= lo:
                    break
                at = max(at, hi)
            offset_of[r] = at
            placed.append((at, size, first[r], last[r]))
        plan = _Plan()
        arena_bytes = max((o + s for o, s, _, _ in placed), default=64)
        plan.arena = torch.empty(arena_bytes + 64, dtype=torch.uint8)
        base = (plan.arena.data_ptr() + 63) // 64 * 64
        words = np.zeros((len(calls), WORDS), dtype=np.int64)
        resets: list[tuple[int, int, int]] = []
        patch_rows, patch_cols, patch_offsets, attention_rows = [], [], [], []
        rotary_rows: dict[str, list[int]] = {}
        step_arg_calls: dict[str, tuple[list[int], list[int]]] = {}  # name -> (calls, words)
        step_ptrs = {name: t.data_ptr() for name, t in step_inputs.items()}
        lasting = _long_lived(self._owners)
        starts = [lo for lo, _ in lasting]
        kept = {ctypes.addressof(o) for c in calls for o in c.keep}

        def lasts(ptr: int) -> bool:
            i = bisect.bisect_right(starts, ptr) - 1
            return ptr in kept or (i >= 0 and ptr < lasting[i][1])

        for i, (call, (ints, floats)) in enumerate(zip(calls, words_of, strict=True)):
            fn = ctypes.cast(call.fn, ctypes.c_void_p).value
            words[i, W_FN] = fn
            words[i, W_RETURNS_INT] = call.fn.restype is ctypes.c_int
            if fn in self._attention:
                attention_rows.append(i)
                for name, pos in ATTENTION_STEP_ARGS.items():
                    if name in step_ptrs and name not in _ROTARY and ints[pos] != step_ptrs[name]:
                        raise _Unreplayable(f"the decode attention's argument {pos} is not the step's {name}")
                suffix = next(
                    (
                        n[3:]
                        for n, p in step_ptrs.items()
                        if n.startswith("cos")
                        and p == ints[ATTENTION_STEP_ARGS["cos"]]
                        and step_ptrs.get(f"sin{n[3:]}") == ints[ATTENTION_STEP_ARGS["sin"]]
                    ),
                    None,
                )
                if suffix is None:
                    raise _Unreplayable("the decode attention's cos and sin are not a rotary table of the step")
                rotary_rows.setdefault(suffix, []).append(i)
            pointers = [
                t not in (ctypes.c_float, ctypes.c_int, ctypes.c_int64)
                for t in call.fn.argtypes
                if t is not ctypes.c_float
            ]  # per integer-class argument: whether it is an address
            steps_args = (
                {ATTENTION_STEP_ARGS[n] for n in ("cos", "sin", "tables", "ctx_lens")}
                if fn in self._attention
                else set()
            )
            for name, pos in self._step_args.get(fn, {}).items():
                if name not in step_ptrs or ints[pos] != step_ptrs[name]:
                    raise _Unreplayable(f"{call.fn.__name__}'s argument {pos} is not the step's {name}")
                step_arg_calls.setdefault(name, ([], []))[0].append(i)
                step_arg_calls[name][1].append(W_INTS + pos)
                steps_args.add(pos)
            for j, a in enumerate(ints):
                r = region_of(a)
                if r is None and pointers[j] and a and j not in steps_args and not lasts(a):
                    raise _Unreplayable(f"{call.fn.__name__}'s argument {j} points to memory of one call")
                if r == logits_base:
                    patch_rows.append(i)
                    patch_cols.append(W_INTS + j)
                    patch_offsets.append(a - logits_base)
                elif r is not None:
                    a = base + offset_of[r] + (a - r)
                words[i, W_INTS + j] = a
            packed = struct.pack(f"{FLOATS}f", *floats, *[0.0] * (FLOATS - len(floats)))
            words[i, W_FLOATS:] = np.frombuffer(packed, dtype=np.int64)
            words[i, W_RESET_FIRST] = len(resets)
            words[i, W_RESET_COUNT] = len(call.resets)
            for address, before in call.resets:
                snapshot = np.frombuffer(before, dtype=np.uint8).copy()
                plan.keep.append(snapshot)
                resets.append((address, snapshot.ctypes.data, len(before)))
            plan.keep.extend(call.keep)
        plan.words = words
        plan.resets = np.array(resets or [(0, 0, 0)], dtype=np.int64)
        plan.calls = len(calls)
        plan.attention_rows = np.array(attention_rows, dtype=np.int64)
        plan.attention_rotary = {n: np.array(r, dtype=np.int64) for n, r in rotary_rows.items()}
        plan.step_args = [
            (n, np.array(c, dtype=np.int64), np.array(w, dtype=np.int64)) for n, (c, w) in step_arg_calls.items()
        ]
        plan.logits_patch = (
            np.array(patch_rows, dtype=np.int64),
            np.array(patch_cols, dtype=np.int64),
            np.array(patch_offsets, dtype=np.int64),
        )
        plan.logits_shape, plan.logits_stride = tuple(logits.shape), tuple(logits.stride())
        plan.logits_numel = regions[logits_base][0] // 4
        plan.logits_offset = (logits.data_ptr() - logits_base) // 4
        hidden_at = base + offset_of[hidden_base] + (hidden.data_ptr() - hidden_base) - plan.arena.data_ptr()
        plan.hidden = plan.arena[hidden_at : hidden_at + hidden.numel() * 4].view(torch.float32).view(hidden.shape)
        return plan

    # ------------------------------------------------------------------ replaying

    def run(
        self,
        rows: int,
        hidden: torch.Tensor,
        step_inputs: dict[str, torch.Tensor],
        max_blocks: int,
        greedy: bool,
        adapters: bool = False,
    ) -> tuple[torch.Tensor, list[int] | None] | None:
        """The logits of a step of `rows` rows (and with `greedy`, each row's argmax when all logits are finite),
        or None when steps of that many rows have no validated plan."""
        plan = self._plans.get(_key(rows, adapters))
        if plan is None or not plan.validated:
            return None
        return self._replay(plan, hidden, step_inputs, max_blocks, greedy)

    def validate(
        self,
        rows: int,
        reference: Callable[[torch.Tensor], torch.Tensor],
        hidden: torch.Tensor,
        step_inputs: dict[str, torch.Tensor],
        max_blocks: int,
        adapters: bool = False,
    ) -> torch.Tensor | None:
        """For a recorded plan not yet checked: the Python forward's logits, after checking that the replay gives the
        same bits (else the plan is dropped). None when there is no plan to check."""
        plan = self._plans.get(_key(rows, adapters))
        if plan is None or plan.validated:
            return None
        expected = reference(hidden)
        got, _ = self._replay(plan, hidden, step_inputs, max_blocks, False)
        if got.shape == expected.shape and torch.equal(got.view(torch.int32), expected.view(torch.int32)):
            plan.validated = True
            log.info("native engine: decode steps of %d rows replay %d kernel calls in one C call", rows, plan.calls)
        else:
            self._plans[_key(rows, adapters)] = None
            log.warning(
                "native engine: the replayed step of %d rows differs from the Python forward; "
                "those steps run from Python",
                rows,
            )
        return expected

    def _replay(
        self, plan: _Plan, hidden: torch.Tensor, step_inputs: dict[str, torch.Tensor], max_blocks: int, greedy: bool
    ) -> tuple[torch.Tensor, list[int] | None]:
        plan.hidden.copy_(hidden)
        words = plan.words
        rows_a = plan.attention_rows
        if len(rows_a):
            for name, pos in ATTENTION_STEP_ARGS.items():
                if name not in _ROTARY:
                    words[rows_a, W_INTS + pos] = max_blocks if name == "max_blocks" else step_inputs[name].data_ptr()
            for suffix, rows_r in plan.attention_rotary.items():
                for name in _ROTARY:
                    words[rows_r, W_INTS + ATTENTION_STEP_ARGS[name]] = step_inputs[name + suffix].data_ptr()
        for name, calls, columns in plan.step_args:
            words[calls, columns] = step_inputs[name].data_ptr()
        storage = torch.empty(plan.logits_numel, dtype=torch.float32)
        prow, pcol, poff = plan.logits_patch
        words[prow, pcol] = storage.data_ptr() + poff
        rc = self._lib.replay_run(words.ctypes.data, plan.calls, plan.resets.ctypes.data)
        if rc != 0:
            raise MemoryError(f"a kernel of the step could not allocate its scratch (call {rc - 1})")
        logits = storage.as_strided(plan.logits_shape, plan.logits_stride, plan.logits_offset)
        if not greedy or self._argmax is None or logits.stride(-1) != 1:
            return logits, None
        out = torch.empty(logits.shape[0], dtype=torch.int64)
        bad = self._argmax.argmax_rows_finite_f32(
            logits.data_ptr(), logits.stride(0), logits.shape[0], logits.shape[1], out.data_ptr()
        )
        return logits, (out.tolist() if bad == 0 else None)
