"""Prometheus exposition. Scheduler state is read at scrape time from each model's `SchedulerStats`.

Names follow vLLM's where one exists (`switchyard_` prefix instead of `vllm:`); Triton's `nv_*` request metrics
come with the operations work.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.repository.registry import ModelRegistry


class SchedulerCollector(Collector):
    def __init__(self, registry: ModelRegistry) -> None:
        self._models = registry

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        running = GaugeMetricFamily("switchyard_num_requests_running", "Sequences in the running batch.", labels=["model"])
        waiting = GaugeMetricFamily("switchyard_num_requests_waiting", "Sequences waiting for admission.", labels=["model"])
        kv_used = GaugeMetricFamily("switchyard_kv_cache_blocks_used", "KV-cache blocks in use.", labels=["model"])
        kv_usage = GaugeMetricFamily("switchyard_kv_cache_usage_ratio", "Fraction of KV-cache blocks in use.", labels=["model"])
        preempt = CounterMetricFamily("switchyard_num_preemptions", "Sequences preempted for lack of KV blocks.", labels=["model"])
        steps = CounterMetricFamily("switchyard_engine_steps", "Model steps executed.", labels=["model"])
        prefix_q = CounterMetricFamily(
            "switchyard_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", labels=["model"]
        )
        prefix_h = CounterMetricFamily(
            "switchyard_prefix_cache_hits", "Prompt tokens found in the prefix cache.", labels=["model"]
        )
        sessions = GaugeMetricFamily("switchyard_kv_sessions", "Stateful KV sessions holding pinned blocks.", labels=["model"])
        pinned = GaugeMetricFamily("switchyard_kv_session_pinned_blocks", "KV blocks pinned by sessions.", labels=["model"])
        for model in self._models.models():
            s = model.scheduler.stats()
            running.add_metric([model.name], s.running)
            waiting.add_metric([model.name], s.waiting)
            kv_used.add_metric([model.name], s.kv_blocks_used)
            kv_usage.add_metric([model.name], s.kv_usage)
            preempt.add_metric([model.name], s.preemptions)
            steps.add_metric([model.name], s.steps)
            prefix_q.add_metric([model.name], s.prefix_cache_queried_tokens)
            prefix_h.add_metric([model.name], s.prefix_cache_hit_tokens)
            sessions.add_metric([model.name], s.sessions)
            pinned.add_metric([model.name], s.session_pinned_blocks)
        yield from (running, waiting, kv_used, kv_usage, preempt, steps, prefix_q, prefix_h, sessions, pinned)


def build_metrics_registry(models: ModelRegistry) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(models))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
