"""/metrics for each model's share of the CPU (cpu_plan.py): the threads it was given and the torch threads its
last batch or step really ran with, read on the thread that ran it (engines/torch_threads.py). Models that take no
share (vLLM, remote upstreams, ONNX Runtime, python models) are not listed."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engines.torch_threads import TorchThreads
from gateway.repository.loaded_model import LoadedLLM, LoadedModel, LoadedTensorModel
from gateway.repository.registry import ModelRegistry


def _threads(model: LoadedModel) -> tuple[int, int] | None:
    """(threads given, torch threads seen) of a model that takes a share; a tensor model's are per instance."""
    if isinstance(model, LoadedLLM):
        engine = getattr(model.scheduler, "engine", None)  # (an engine-less scheduler takes no share)
        given, torch_threads = getattr(engine, "cpu_threads", None), getattr(engine, "torch_threads", None)
        if isinstance(given, int) and isinstance(torch_threads, TorchThreads):
            return given, torch_threads.seen
        return None
    if isinstance(model, LoadedTensorModel):
        shares = [
            t
            for version in model.tensor.versions.values()
            for instance in getattr(version, "instances", ())
            if isinstance(t := getattr(instance, "threads", None), TorchThreads)
        ]
        if shares:
            return max(t.share for t in shares), max(t.seen for t in shares)
    return None


class CpuShareCollector(Collector):
    def __init__(self, models: ModelRegistry) -> None:
        self._models = models

    def collect(self) -> Iterator[Metric]:
        given = GaugeMetricFamily(
            "switchyard_model_cpu_threads",
            "The model's share of the CPU budget: the native engine's kernel threads, or a tensor model's torch "
            "threads per instance (cpu_threads).",
            labels=["model"],
        )
        seen = GaugeMetricFamily(
            "switchyard_model_torch_threads",
            "Torch intra-op threads the model's last step or batch ran with, on its own thread (0: none yet; 1 for "
            "the native engine, whose kernels run on their own threads).",
            labels=["model"],
        )
        for model in sorted(self._models.all_models(), key=lambda m: m.name):
            threads = _threads(model)
            if threads is not None:
                given.add_metric([model.name], threads[0])
                seen.add_metric([model.name], threads[1])
        yield given
        yield seen
