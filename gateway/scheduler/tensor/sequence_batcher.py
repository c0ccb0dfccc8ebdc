"""Triton's sequence batcher for stateful v2 models (`sequence_batching`).

Requests carry `sequence_id` (a positive integer or a string), `sequence_start` and `sequence_end`. A sequence
is bound to one model instance when it starts (the least busy one) and stays there, so a model may keep
per-sequence state in memory keyed by the CORRID control. Requests of one sequence run strictly one after the
other; requests of different sequences on the same instance are batched together (both the `direct` and the
`oldest` strategy behave this way here: a sequence keeps its instance, not a fixed batch slot).

Control inputs are filled in for every request (START, END, READY = 1, CORRID = the sequence id) in the
configured datatype. Implicit state: each `state` input receives what the model returned in the matching
output on the sequence's previous request (the `initial_state`, or zeros, on its first), and state outputs are
not sent to clients. A sequence idle for longer than `max_sequence_idle_microseconds` is released; so is one
whose last request had `sequence_end`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engines.interface import TensorBackend
from gateway.errors import InvalidRequestError
from gateway.observability.inference_stats import ModelStats
from gateway.scheduler.tensor.dynamic_batcher import BatchingPolicy, DynamicBatcher
from gateway.tensor.tensors import DATATYPES

log = logging.getLogger("switchyard.sequence")

_CONTROL_KINDS = {
    "CONTROL_SEQUENCE_START": "start",
    "CONTROL_SEQUENCE_END": "end",
    "CONTROL_SEQUENCE_READY": "ready",
    "CONTROL_SEQUENCE_CORRID": "corrid",
}


@dataclass
class _Sequence:
    instance: int
    state: dict[str, np.ndarray] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    in_flight: int = 0


class SequenceBatcher:
    """The scheduler of one stateful model version; same interface as `DynamicBatcher` plus sequence parameters."""

    takes_sequence_parameters = True

    def __init__(
        self,
        name: str,
        instances: Sequence[TensorBackend],
        config: Any,
        stats: ModelStats | None = None,
        gates: Sequence[Any] | None = None,
    ) -> None:
        self.name = name
        self.stats = stats or ModelStats()
        self.config = config  # gateway.repository.tensor_config.TensorModelConfig
        self.batched = config.max_batch_size > 0
        seq = config.sequence_batching
        strategy = seq.oldest or seq.direct
        delay = (strategy.max_queue_delay_microseconds / 1e6) if strategy is not None else 0.0
        preferred = tuple(getattr(strategy, "preferred_batch_size", []) or [])
        policy = BatchingPolicy(
            max_batch_size=config.max_batch_size,
            dynamic=self.batched,
            preferred_sizes=preferred,
            max_queue_delay_s=delay,
        )
        # one batcher per instance: a sequence's requests always reach the same model instance
        self._batchers = [
            DynamicBatcher(name, [inst], policy, self.stats, [gates[i]] if gates else None)
            for i, inst in enumerate(instances)
        ]
        self.idle_s = seq.max_sequence_idle_microseconds / 1e6
        self.controls = [(c.name, ctl) for c in seq.control_input for ctl in c.control]
        self.states = list(seq.state)
        self._sequences: dict[Any, _Sequence] = {}
        self._reaper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for batcher in self._batchers:
            await batcher.start()
        self._reaper = asyncio.create_task(self._reap(), name=f"sequences-{self.name}")

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        for batcher in self._batchers:
            await batcher.stop()
        self._sequences.clear()

    @property
    def active(self) -> int:
        return len(self._sequences)

    async def _reap(self) -> None:
        """Release sequences that have been idle too long."""
        while True:
            await asyncio.sleep(max(0.01, min(self.idle_s / 4, 1.0)))
            now = time.monotonic()
            for key, sequence in list(self._sequences.items()):
                if sequence.in_flight == 0 and now - sequence.last_used > self.idle_s:
                    log.info("model '%s': releasing idle sequence %r", self.name, key)
                    del self._sequences[key]

    # ------------------------------------------------------------------ requests

    def _parse(self, parameters: dict[str, Any]) -> tuple[Any, bool, bool]:
        sequence_id = parameters.get("sequence_id")
        if sequence_id in (None, 0, ""):
            raise InvalidRequestError(f"model '{self.name}' is stateful: send the 'sequence_id' parameter")
        if isinstance(sequence_id, bool) or not isinstance(sequence_id, (int, str)):
            raise InvalidRequestError("'sequence_id' must be a positive integer or a string")
        if isinstance(sequence_id, int) and not 0 < sequence_id < 2**64:
            raise InvalidRequestError("'sequence_id' must be a positive integer below 2**64")
        if isinstance(sequence_id, str) and len(sequence_id) > 256:
            raise InvalidRequestError("'sequence_id' strings are limited to 256 characters")
        flags = []
        for key in ("sequence_start", "sequence_end"):
            value = parameters.get(key, False)
            if not isinstance(value, bool):
                raise InvalidRequestError(f"'{key}' must be true or false")
            flags.append(value)
        return sequence_id, flags[0], flags[1]

    def _bind(self, sequence_id: Any, start: bool) -> _Sequence:
        sequence = self._sequences.get(sequence_id)
        if start:
            if sequence is not None and sequence.in_flight:
                raise InvalidRequestError(f"sequence {sequence_id!r} is still running; wait for it before restarting")
            busy = [0] * len(self._batchers)
            for s in self._sequences.values():
                busy[s.instance] += 1
            sequence = _Sequence(instance=busy.index(min(busy)))
            self._sequences[sequence_id] = sequence
        elif sequence is None:
            raise InvalidRequestError(
                f"sequence {sequence_id!r} is not active on model '{self.name}' (never started, ended, or idle past "
                "max_sequence_idle_microseconds); send sequence_start=true to begin it"
            )
        return sequence

    def _control_value(self, kind: str, ctl: Any, start: bool, end: bool, sequence_id: Any, rows: int) -> np.ndarray:
        shape = (rows, 1) if self.batched else (1,)
        if kind == "corrid":
            if ctl.data_type == "BYTES":
                return np.full(shape, str(sequence_id).encode(), dtype=object)
            if not isinstance(sequence_id, int):
                raise InvalidRequestError(f"model '{self.name}' needs an integer sequence_id")
            return np.full(shape, sequence_id, dtype=DATATYPES[ctl.data_type])
        on = {"start": start, "end": end, "ready": True}[kind]
        if ctl.int32_false_true:
            return np.full(shape, ctl.int32_false_true[int(on)], dtype=np.int32)
        if ctl.fp32_false_true:
            return np.full(shape, ctl.fp32_false_true[int(on)], dtype=np.float32)
        return np.full(shape, ctl.bool_false_true[int(on)], dtype=np.bool_)

    def _initial_state(self, state: Any, rows: int) -> np.ndarray:
        dims = state.initial_state[0].dims if state.initial_state else [max(d, 1) for d in state.dims]
        shape = ([rows] if self.batched else []) + list(dims)
        if state.data_type == "BYTES":
            return np.full(shape, b"", dtype=object)
        return np.zeros(shape, dtype=DATATYPES[state.data_type])

    async def infer(
        self,
        inputs: dict[str, np.ndarray],
        rows: int = 1,
        priority: int | None = None,
        timeout_us: int | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        sequence_id, start, end = self._parse(parameters or {})
        sequence = self._bind(sequence_id, start)
        sequence.in_flight += 1
        try:
            async with sequence.lock:  # one request of a sequence at a time, in arrival order
                request = dict(inputs)
                for name, ctl in self.controls:
                    request[name] = self._control_value(_CONTROL_KINDS[ctl.kind], ctl, start, end, sequence_id, rows)
                for state in self.states:
                    previous = sequence.state.get(state.input_name)
                    request[state.input_name] = previous if previous is not None else self._initial_state(state, rows)
                result = dict(await self._batchers[sequence.instance].infer(request, rows, priority, timeout_us))
                for state in self.states:
                    if state.output_name in result:
                        sequence.state[state.input_name] = np.asarray(result.pop(state.output_name))
                return result
        finally:
            sequence.in_flight -= 1
            sequence.last_used = time.monotonic()
            if end and self._sequences.get(sequence_id) is sequence and not sequence.in_flight:
                del self._sequences[sequence_id]

    async def infer_stream(
        self,
        inputs: dict[str, np.ndarray],
        rows: int = 1,
        priority: int | None = None,
        timeout_us: int | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        yield await self.infer(inputs, rows, priority, timeout_us, parameters)
