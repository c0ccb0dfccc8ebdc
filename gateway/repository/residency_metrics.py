"""/metrics for the model lifecycle: loads, unloads and evictions by reason, load time, resident bytes per model and
the memory budget (counted in `ResidencyStats` by `resident_memory.py` and read at scrape time; labels are model
folder names)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gateway.observability.request_metrics import Histogram

LOAD_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)


class ResidencyStats:
    """Counters for /metrics, as plain numbers read at scrape time."""

    def __init__(self) -> None:
        self.loads: dict[tuple[str, str], int] = {}  # (model folder, success|failure) -> count
        self.unloads: dict[tuple[str, str], int] = {}  # (folder, reason: idle|memory|admin|poll|failed) -> count
        self.evictions: dict[tuple[str, str], int] = {}  # (folder, reason: idle|memory) -> count
        self.load_seconds: dict[str, Histogram] = {}  # folder -> histogram of successful loads' durations

    @staticmethod
    def count(table: dict[tuple[str, str], int], folder: str, label: str) -> None:
        table[(folder, label)] = table.get((folder, label), 0) + 1

    def loaded(self, folder: str, seconds: float) -> None:
        self.count(self.loads, folder, "success")
        self.load_seconds.setdefault(folder, Histogram(LOAD_SECONDS_BUCKETS)).observe(seconds)


class ResidencyCollector(Collector):
    """switchyard_model_* metrics of `control.residency.memory` (a ModelControl's `ResidentMemory`)."""

    def __init__(self, control: Any) -> None:
        self._control = control

    def collect(self) -> Iterator[Metric]:
        memory = self._control.residency.memory
        stats = memory.stats
        loads = CounterMetricFamily(
            "switchyard_model_loads", "Model loads, by result (success, failure).", labels=["model", "result"]
        )
        for (model, result), n in sorted(stats.loads.items()):
            loads.add_metric([model, result], n)
        unloads = CounterMetricFamily(
            "switchyard_model_unloads",
            "Models taken out of service, by reason (idle: keep-alive expired, memory: "
            "evicted for the budget, admin: the repository API, poll: removed from the repository, failed: did not "
            "start).",
            labels=["model", "reason"],
        )
        for (model, reason), n in sorted(stats.unloads.items()):
            unloads.add_metric([model, reason], n)
        evictions = CounterMetricFamily(
            "switchyard_model_evictions",
            "Automatic unloads, by reason (idle: keep-alive expired, memory: least "
            "recently used idle model evicted for the budget).",
            labels=["model", "reason"],
        )
        for (model, reason), n in sorted(stats.evictions.items()):
            evictions.add_metric([model, reason], n)
        seconds = HistogramMetricFamily(
            "switchyard_model_load_seconds", "Time to load a model (successful loads).", labels=["model"]
        )
        for model, histogram in sorted(stats.load_seconds.items()):
            buckets, total = histogram.cumulative()
            seconds.add_metric([model], [(floatToGoString(b), float(n)) for b, n in buckets], total)
        resident = GaugeMetricFamily(
            "switchyard_model_resident_bytes",
            "Bytes the memory budget counts for each "
            "loaded model (the engine's figure, else the estimate or RSS growth).",
            labels=["model"],
        )
        for model, r in sorted(memory.resident.items()):
            resident.add_metric([model], r.bytes)
        yield from (loads, unloads, evictions, seconds, resident)
        yield GaugeMetricFamily(
            "switchyard_memory_budget_bytes", "The memory budget (--memory-budget).", value=memory.budget
        )
        yield GaugeMetricFamily(
            "switchyard_memory_used_bytes",
            "Memory in use as the budget counts it: the larger of the server's RSS and its models' counted bytes.",
            value=memory.used_bytes(),
        )
