"""Ensembles (`platform: ensemble`): one request runs a DAG of other models' steps.

Tensors flow by name: a step's `input_map` says which ensemble tensor feeds each of the step model's inputs,
its `output_map` names the ensemble tensors its outputs become. Steps run as soon as their inputs exist (steps
that do not depend on each other run concurrently), each through the step model's own batcher, so ensemble
traffic is batched with direct traffic to the same models. The graph is checked when the ensemble loads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from gateway.errors import ConfigError, InternalError, ServiceUnavailableError
from gateway.observability.inference_stats import failure_reason
from gateway.tensor.tensors import InputTensor, datatype_of

if TYPE_CHECKING:
    from gateway.tensor.model import TensorModel

#: The loaded tensor model that answers a name, or None (the registry's lookup, seen from the runtime).
FindTensor = Callable[[str], "TensorModel | None"]


def check_graph(config_path: Any, inputs: list[str], outputs: list[str], steps: list[Any], find: FindTensor) -> None:
    """Every step input is produced before it is needed, every output is produced, the step models exist."""
    available = set(inputs)
    pending = list(steps)
    while pending:
        ready = [s for s in pending if set(s.input_map.values()) <= available]
        if not ready:
            missing = sorted(set().union(*(set(s.input_map.values()) for s in pending)) - available)
            raise ConfigError(
                f"{config_path}: ensemble tensors {missing} are never produced (or the steps form a "
                "cycle); fix input_map / output_map."
            )
        for step in ready:
            available |= set(step.output_map.values())
            pending.remove(step)
    missing_out = [o for o in outputs if o not in available]
    if missing_out:
        raise ConfigError(f"{config_path}: ensemble outputs {missing_out} are not produced by any step's output_map.")
    for step in steps:
        if find(step.model_name) is None:
            raise ConfigError(
                f"{config_path}: ensemble step model '{step.model_name}' is not a loaded tensor model; "
                "add it to the repository."
            )


class EnsembleScheduler:
    """Runs an ensemble request; has the batcher interface the model layer expects."""

    takes_sequence_parameters = False

    def __init__(self, name: str, find: FindTensor, steps: list[Any], output_names: list[str], stats: Any) -> None:
        self.name = name
        self.find = find
        self.steps = steps
        self.output_names = output_names
        self.stats = stats

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def _run_step(self, step: Any, tensors: dict[str, np.ndarray], parameters: dict[str, Any]) -> dict[str, Any]:
        model = self.find(step.model_name)
        if model is None:
            raise ServiceUnavailableError(f"ensemble '{self.name}': step model '{step.model_name}' is not loaded")
        inputs = [
            InputTensor(model_input, datatype_of(tensors[source]), tensors[source])
            for model_input, source in step.input_map.items()
        ]
        version = None if step.model_version == -1 else str(step.model_version)
        _, outputs = await model.infer(inputs, list(step.output_map), version, parameters)
        return {step.output_map[o.name]: o.array for o in outputs}

    async def infer(
        self, inputs: dict[str, np.ndarray], rows: int = 1, priority: int | None = None, timeout_us: int | None = None
    ) -> dict[str, Any]:
        start = time.monotonic_ns()
        tensors = dict(inputs)
        pending = list(self.steps)
        parameters = {k: v for k, v in (("priority", priority), ("timeout", timeout_us)) if v is not None}
        try:
            while pending:
                ready = [s for s in pending if set(s.input_map.values()) <= set(tensors)]
                if not ready:
                    raise InternalError(f"ensemble '{self.name}' cannot make progress; check its configuration")
                for step in ready:
                    pending.remove(step)
                for produced in await asyncio.gather(*(self._run_step(s, tensors, parameters) for s in ready)):
                    tensors.update(produced)
        except BaseException as exc:
            self.stats.record_failure(time.monotonic_ns() - start, failure_reason(exc))
            raise
        elapsed = time.monotonic_ns() - start
        self.stats.success.add(elapsed)
        self.stats.record_batch(rows, 1, 0, elapsed, 0)
        return {name: tensors[name] for name in self.output_names if name in tensors}

    async def infer_stream(
        self, inputs: dict[str, np.ndarray], rows: int = 1, priority: int | None = None, timeout_us: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        yield await self.infer(inputs, rows, priority, timeout_us)
