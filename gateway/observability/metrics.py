"""Prometheus exposition: one `CollectorRegistry` per app, every number read at scrape time.

Nothing here is updated per request: schedulers, batchers and `request_metrics.py` keep plain numbers on
the event loop and these collectors read them when Prometheus scrapes, so several apps in one process never share
state (no default registry) and the hot path takes no lock.

* LLM metrics use vLLM's names with a `switchyard_` prefix instead of `vllm:`, labelled `model`.
* Triton's `nv_*` metrics, labelled `model` and `version`, for tensor models (from the KServe statistics) and LLMs
  (version "1"). prometheus_client would add `_total` to a counter's name, and Triton's have none, so the `nv_*`
  counters are exposed untyped under their exact Triton names; they are cumulative like counters.
"""

from __future__ import annotations

from collections.abc import Iterator

import psutil
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from engines.cpu_budget import cpu_budget
from gateway.observability.http_metrics import EndpointCounts
from gateway.observability.inference_stats import FAILURE_REASONS
from gateway.observability.request_metrics import Histogram
from gateway.repository.cpu_share_metrics import CpuShareCollector
from gateway.repository.registry import ModelRegistry
from gateway.scheduler.llm.queue_policy import REJECTION_REASONS
from gateway.scheduler.tensor.rate_limiter import RateLimiter


class SchedulerCollector(Collector):
    """LLM scheduler state (running/waiting sequences, KV cache, preemptions, prefix cache, sessions, speculative
    decoding: vLLM's spec_decode counters)."""

    def __init__(self, registry: ModelRegistry) -> None:
        self._models = registry

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily(
            "switchyard_num_requests_running", "Sequences in the running batch.", labels=["model"]
        )
        waiting = GaugeMetricFamily(
            "switchyard_num_requests_waiting", "Sequences waiting for admission.", labels=["model"]
        )
        kv_used = GaugeMetricFamily("switchyard_kv_cache_blocks_used", "KV-cache blocks in use.", labels=["model"])
        kv_usage = GaugeMetricFamily(
            "switchyard_kv_cache_usage_ratio", "Fraction of KV-cache blocks in use.", labels=["model"]
        )
        preempt = CounterMetricFamily(
            "switchyard_num_preemptions", "Sequences preempted for lack of KV blocks.", labels=["model"]
        )
        steps = CounterMetricFamily("switchyard_engine_steps", "Model steps executed.", labels=["model"])
        prefix_q = CounterMetricFamily(
            "switchyard_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", labels=["model"]
        )
        prefix_h = CounterMetricFamily(
            "switchyard_prefix_cache_hits", "Prompt tokens found in the prefix cache.", labels=["model"]
        )
        hit_rate = GaugeMetricFamily(
            "switchyard_prefix_cache_hit_rate", "Prefix-cache hits / queries since the model loaded.", labels=["model"]
        )
        sessions = GaugeMetricFamily(
            "switchyard_kv_sessions", "Stateful KV sessions holding pinned blocks.", labels=["model"]
        )
        pinned = GaugeMetricFamily(
            "switchyard_kv_session_pinned_blocks", "KV blocks pinned by sessions.", labels=["model"]
        )
        drafts = CounterMetricFamily(
            "switchyard_spec_decode_num_drafts",
            "Speculative proposals verified (steps of one sequence).",
            labels=["model"],
        )
        draft_tokens = CounterMetricFamily(
            "switchyard_spec_decode_num_draft_tokens", "Tokens proposed by speculative decoding.", labels=["model"]
        )
        accepted = CounterMetricFamily(
            "switchyard_spec_decode_num_accepted_tokens", "Proposed tokens accepted by verification.", labels=["model"]
        )
        rejected = CounterMetricFamily(
            "switchyard_requests_rejected",
            "Requests refused by the model's queue policy (429), by reason: queue_full, expected_wait, queue_timeout.",
            labels=["model", "reason"],
        )
        expected_wait = GaugeMetricFamily(
            "switchyard_queue_expected_wait_seconds",
            "Expected wait for admission of a request arriving now (0 while the admission rate is unknown).",
            labels=["model"],
        )
        for model in self._models.llms():
            s = model.scheduler.stats()
            running.add_metric([model.name], s.running)
            waiting.add_metric([model.name], s.waiting)
            kv_used.add_metric([model.name], s.kv_blocks_used)
            kv_usage.add_metric([model.name], s.kv_usage)
            preempt.add_metric([model.name], s.preemptions)
            steps.add_metric([model.name], s.steps)
            prefix_q.add_metric([model.name], s.prefix_cache_queried_tokens)
            prefix_h.add_metric([model.name], s.prefix_cache_hit_tokens)
            queried = s.prefix_cache_queried_tokens
            hit_rate.add_metric([model.name], s.prefix_cache_hit_tokens / queried if queried else 0.0)
            sessions.add_metric([model.name], s.sessions)
            pinned.add_metric([model.name], s.session_pinned_blocks)
            drafts.add_metric([model.name], s.spec_drafts)
            draft_tokens.add_metric([model.name], s.spec_draft_tokens)
            accepted.add_metric([model.name], s.spec_accepted_tokens)
            for reason in REJECTION_REASONS:
                rejected.add_metric([model.name, reason], s.rejected.get(reason, 0))
            expected_wait.add_metric([model.name], s.expected_wait_seconds)
        yield from (
            running,
            waiting,
            kv_used,
            kv_usage,
            preempt,
            steps,
            prefix_q,
            prefix_h,
            hit_rate,
            sessions,
            pinned,
            drafts,
            draft_tokens,
            accepted,
            rejected,
            expected_wait,
        )


def _histogram(family: HistogramMetricFamily, labels: list[str], histogram: Histogram) -> None:
    buckets, total = histogram.cumulative()
    family.add_metric(labels, [(floatToGoString(bound), float(n)) for bound, n in buckets], total)


class LLMRequestCollector(Collector):
    """Per-request LLM metrics (vLLM's names): latency histograms, token counters, finished requests."""

    def __init__(self, registry: ModelRegistry) -> None:
        self._models = registry

    def collect(self) -> Iterator[Metric]:
        labels = ["model"]
        ttft = HistogramMetricFamily(
            "switchyard_time_to_first_token_seconds", "Time from arrival to the first output token.", labels=labels
        )
        tpot = HistogramMetricFamily(
            "switchyard_time_per_output_token_seconds",
            "Time between output tokens (inter-token latency).",
            labels=labels,
        )
        e2e = HistogramMetricFamily(
            "switchyard_e2e_request_latency_seconds", "Time from arrival to the final output.", labels=labels
        )
        queue = HistogramMetricFamily(
            "switchyard_request_queue_time_seconds", "Time from arrival to admission by the scheduler.", labels=labels
        )
        prompt = CounterMetricFamily("switchyard_prompt_tokens", "Prompt tokens prefilled.", labels=labels)
        generation = CounterMetricFamily("switchyard_generation_tokens", "Output tokens generated.", labels=labels)
        success = CounterMetricFamily(
            "switchyard_request_success", "Finished requests by finish reason.", labels=[*labels, "finished_reason"]
        )
        for model in self._models.llms():
            r = model.scheduler.stats().requests
            name = [model.name]
            _histogram(ttft, name, r.ttft)
            _histogram(tpot, name, r.inter_token)
            _histogram(e2e, name, r.e2e)
            _histogram(queue, name, r.queue_time)
            prompt.add_metric(name, r.prompt_tokens)
            generation.add_metric(name, r.generation_tokens)
            finished = {"stop": 0, "length": 0, **r.finished}
            for reason, count in sorted(finished.items()):
                success.add_metric([model.name, reason], count)
        yield from (ttft, tpot, e2e, queue, prompt, generation, success)


class TritonCollector(Collector):
    """Triton's per-model `nv_inference_*` metrics and `nv_model_load_duration_secs`, for every loaded model."""

    _COUNTERS = (
        (
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
            lambda s: s.success.count,
        ),
        (
            "nv_inference_count",
            "Number of inferences performed (does not include cached requests)",
            lambda s: s.inference_count,
        ),
        (
            "nv_inference_exec_count",
            "Number of model executions performed (does not include cached requests)",
            lambda s: s.execution_count,
        ),
        (
            "nv_inference_request_duration_us",
            "Cumulative inference request duration in microseconds",
            lambda s: s.success.ns // 1000,
        ),
        (
            "nv_inference_queue_duration_us",
            "Cumulative inference queuing duration in microseconds",
            lambda s: s.queue.ns // 1000,
        ),
        (
            "nv_inference_compute_input_duration_us",
            "Cumulative compute input duration in microseconds",
            lambda s: s.compute_input.ns // 1000,
        ),
        (
            "nv_inference_compute_infer_duration_us",
            "Cumulative compute inference duration in microseconds",
            lambda s: s.compute_infer.ns // 1000,
        ),
        (
            "nv_inference_compute_output_duration_us",
            "Cumulative inference compute output duration in microseconds",
            lambda s: s.compute_output.ns // 1000,
        ),
    )

    def __init__(self, registry: ModelRegistry) -> None:
        self._models = registry

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "version"]
        counters = [(UnknownMetricFamily(name, doc, labels=labels), read) for name, doc, read in self._COUNTERS]
        failure = UnknownMetricFamily(
            "nv_inference_request_failure",
            "Number of failed inference requests, all batch sizes",
            labels=[*labels, "reason"],
        )
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            labels=labels,
        )
        load = GaugeMetricFamily("nv_model_load_duration_secs", "Model load time in seconds", labels=labels)
        for model in self._models.all_models():
            for version, stats, waiting in model.version_stats():
                key = [model.name, str(version)]
                for family, read in counters:
                    family.add_metric(key, read(stats))
                for reason in FAILURE_REASONS:
                    failure.add_metric([*key, reason], stats.fail_reasons.get(reason, 0))
                pending.add_metric(key, waiting)
                load.add_metric(key, model.load_seconds)
        yield from (family for family, _ in counters[:1])
        yield failure
        yield from (family for family, _ in counters[1:])
        yield from (pending, load)


class RateLimiterCollector(Collector):
    """The rate limiter (`--rate-limit execution_count`): time requests waited for their instance's resources (per
    model version; also part of nv_inference_queue_duration_us), and each resource's amount and use."""

    def __init__(self, registry: ModelRegistry, limiter: RateLimiter | None) -> None:
        self._models = registry
        self._limiter = limiter

    def collect(self) -> Iterator[Metric]:
        limiter = self._limiter
        if limiter is None:
            return
        labels = ["model", "version"]
        wait_us = CounterMetricFamily(
            "switchyard_rate_limiter_wait_duration_us",
            "Cumulative time requests waited for the rate limiter, in microseconds",
            labels=labels,
        )
        waits = CounterMetricFamily(
            "switchyard_rate_limiter_wait_requests", "Requests that went through the rate limiter", labels=labels
        )
        for model in self._models.all_models():
            for version, stats, _ in model.version_stats():
                wait_us.add_metric([model.name, str(version)], stats.rate_limiter.ns // 1000)
                waits.add_metric([model.name, str(version)], stats.rate_limiter.count)
        amount = GaugeMetricFamily(
            "switchyard_rate_limiter_resource_count",
            "Copies of a rate limiter resource (device 'global' for global resources)",
            labels=["resource", "device"],
        )
        used = GaugeMetricFamily(
            "switchyard_rate_limiter_resource_in_use",
            "Copies of a rate limiter resource held by executing instances",
            labels=["resource", "device"],
        )
        for name, device, total, in_use in limiter.snapshot():
            key = [name, "global" if device is None else str(device)]
            amount.add_metric(key, total)
            used.add_metric(key, in_use)
        yield from (wait_us, waits, amount, used)
        yield GaugeMetricFamily(
            "switchyard_rate_limiter_waiting_instances",
            "Model instances waiting for rate limiter resources",
            value=limiter.waiting,
        )


class CpuCollector(Collector):
    """Triton's host metrics: CPU utilization since the previous scrape and RAM (used = total - available); and
    the CPU budget the engines size their threads from (engines/cpu_budget.py), to check against the pod's limits."""

    def __init__(self) -> None:
        psutil.cpu_percent(interval=None)  # starts the interval the first scrape reports on

    def collect(self) -> Iterator[Metric]:
        memory = psutil.virtual_memory()
        yield GaugeMetricFamily(
            "nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=psutil.cpu_percent(interval=None) / 100.0
        )
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=memory.total)
        yield GaugeMetricFamily(
            "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=memory.total - memory.available
        )
        try:
            budget = cpu_budget()
        except ValueError:  # a bad OMP_NUM_THREADS: the engines refuse to load and say why
            return
        threads = GaugeMetricFamily(
            "switchyard_cpu_budget_threads",
            "Compute threads the CPU budget gives the "
            "engines (affinity mask, cgroup quota, OMP_NUM_THREADS), by what decided it",
            labels=["source"],
        )
        threads.add_metric([budget.source], budget.threads)
        yield threads
        yield GaugeMetricFamily(
            "switchyard_cpu_limit",
            "CPUs this process may use: its affinity mask capped by its cgroup CPU quota (fractional)",
            value=budget.cpus,
        )


class EndpointCollector(Collector):
    """HTTP requests by endpoint, method and status (gateway/observability/http_metrics.py)."""

    def __init__(self, counts: EndpointCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "switchyard_http_requests",
            "HTTP requests by endpoint (route), method and status.",
            labels=["endpoint", "method", "status"],
        )
        for (endpoint, method, status), n in sorted(self._counts.counts.items()):
            family.add_metric([endpoint, method, status], n)
        yield family


def build_metrics_registry(
    models: ModelRegistry, endpoints: EndpointCounts | None = None, rate_limiter: RateLimiter | None = None
) -> CollectorRegistry:
    """A fresh registry for one app (never prometheus_client's global one); `rate_limiter`: the server's, if any."""
    registry = CollectorRegistry()
    for collector in (
        SchedulerCollector(models),
        LLMRequestCollector(models),
        TritonCollector(models),
        RateLimiterCollector(models, rate_limiter),
        CpuCollector(),
        CpuShareCollector(models),
    ):
        registry.register(collector)
    if endpoints is not None:
        registry.register(EndpointCollector(endpoints))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
