"""Which scheduler serves a tensor model version: the dynamic batcher (default), the stateful sequence batcher
(`sequence_batching`) or the ensemble runner (`ensemble_scheduling`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.tensor.ensemble import FindTensor


def scheduler_factory(find: FindTensor) -> Callable[[Any, Any], Any]:
    """A `TensorModel.load` hook; returns None to get the default dynamic batcher. `find`: where an ensemble finds
    the models its steps call."""

    def make(model: Any, entry: Any) -> Any:
        config = model.config
        if config.sequence_batching is not None:
            from gateway.scheduler.tensor.sequence_batcher import SequenceBatcher

            return SequenceBatcher(model.name, entry.instances, config, entry.stats, entry.gates or None)
        if config.ensemble_scheduling is not None:
            from gateway.tensor.ensemble import EnsembleScheduler, check_graph

            steps = list(config.ensemble_scheduling.step)
            check_graph(
                model.dir.config_path, [s.name for s in entry.inputs], [s.name for s in entry.outputs], steps, find
            )
            return EnsembleScheduler(model.name, find, steps, [s.name for s in entry.outputs], entry.stats)
        return None

    return make
