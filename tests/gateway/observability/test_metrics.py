"""The Prometheus exposition: Triton's and vLLM's names and values from scripted statistics, one registry per app,
and Triton's failure reasons as the dynamic batcher records them."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from engines.cpu_budget import cpu_budget
from gateway.errors import InternalError, RateLimitError, ServiceUnavailableError
from gateway.observability.inference_stats import ModelStats
from gateway.observability.metrics import build_metrics_registry, render
from gateway.repository.loaded_model import LoadedLLM, LoadedTensorModel
from gateway.repository.registry import ModelRegistry
from gateway.scheduler.llm.interface import SchedulerStats
from gateway.scheduler.tensor.dynamic_batcher import BatchingPolicy, DynamicBatcher, QueueRules
from tests.gateway.scheduler.tensor.test_dynamic_batcher import _Failing, request, started_held, until


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(parsed: dict, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in parsed, f"{name}{labels} not exposed"
    return parsed[key]


def fake_registry(llm_name: str = "llm", tensor_name: str = "tensor") -> ModelRegistry:
    """A registry holding an LLM and a tensor model whose schedulers and batchers report fixed statistics."""
    stats = SchedulerStats(
        waiting=3,
        prefix_cache_queried_tokens=40,
        prefix_cache_hit_tokens=10,
        spec_drafts=4,
        spec_draft_tokens=16,
        spec_accepted_tokens=9,
        rejected={"queue_timeout": 2},
        expected_wait_seconds=1.5,
    )
    r = stats.requests
    r.ttft.observe(0.003)
    r.ttft.observe(0.2)
    r.inter_token.observe(0.02, times=5)
    r.e2e.observe(1.2)
    r.e2e.observe(0.4)
    r.queue_time.observe(0.01, times=2)
    r.prompt_tokens, r.generation_tokens = 17, 7
    r.finished = {"stop": 1, "abort": 1}
    r.model_stats.success.add(1_200_000_000)
    r.model_stats.queue.add(5_000_000)
    r.model_stats.record_batch(1, 1, 0, 1_195_000_000, 0)
    r.model_stats.record_failure(400_000_000, "CANCELED")
    llm = LoadedLLM(
        name=llm_name,
        config=None,
        scheduler=SimpleNamespace(stats=lambda: stats),  # type: ignore[arg-type]
        load_seconds=4.5,
    )

    tstats = ModelStats()
    for _ in range(3):
        tstats.success.add(2_000_000)
    tstats.queue.add(1_500_000, 3)
    tstats.record_batch(rows=5, requests=3, input_ns=0, infer_ns=1_000_000, output_ns=0)
    tstats.record_failure(10_000, "OTHER")
    tstats.record_failure(0, "REJECTED")
    tstats.record_failure(0, "REJECTED")
    versions = {2: SimpleNamespace(stats=tstats, batcher=SimpleNamespace(queued=2))}
    tensor = LoadedTensorModel(
        name=tensor_name,
        config=None,
        tensor=SimpleNamespace(versions=versions),  # type: ignore[arg-type]
        load_seconds=0.25,
    )
    registry = ModelRegistry()
    registry.publish(llm)
    registry.publish(tensor)
    return registry


def test_triton_metrics_have_triton_names_labels_and_units() -> None:
    text = render(build_metrics_registry(fake_registry())).decode()  # type: ignore[arg-type]
    # Triton's exact sample names: no `_total` suffix.
    assert re.search(r'^nv_inference_request_success\{model="tensor",version="2"\} 3\.0$', text, re.MULTILINE)
    assert "nv_inference_request_success_total" not in text
    parsed = samples(text)
    t = {"model": "tensor", "version": "2"}
    assert value(parsed, "nv_inference_count", **t) == 5  # rows
    assert value(parsed, "nv_inference_exec_count", **t) == 1  # backend calls
    assert value(parsed, "nv_inference_request_duration_us", **t) == 6000
    assert value(parsed, "nv_inference_queue_duration_us", **t) == 1500
    assert value(parsed, "nv_inference_compute_infer_duration_us", **t) == 3000  # 1 ms, once per request of the batch
    assert value(parsed, "nv_inference_compute_input_duration_us", **t) == 0
    assert value(parsed, "nv_inference_compute_output_duration_us", **t) == 0
    failures = {
        reason: value(parsed, "nv_inference_request_failure", **t, reason=reason)
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    }
    assert failures == {"REJECTED": 2, "CANCELED": 0, "BACKEND": 0, "OTHER": 1}
    assert value(parsed, "nv_inference_pending_request_count", **t) == 2
    assert value(parsed, "nv_model_load_duration_secs", **t) == 0.25
    # LLMs are version 1, with the same counters.
    m = {"model": "llm", "version": "1"}
    assert value(parsed, "nv_inference_request_success", **m) == 1
    assert value(parsed, "nv_inference_request_failure", **m, reason="CANCELED") == 1
    assert value(parsed, "nv_inference_count", **m) == 1 and value(parsed, "nv_inference_exec_count", **m) == 1
    assert value(parsed, "nv_inference_request_duration_us", **m) == 1_200_000
    assert value(parsed, "nv_inference_pending_request_count", **m) == 3
    assert value(parsed, "nv_model_load_duration_secs", **m) == 4.5
    # host
    assert 0.0 <= value(parsed, "nv_cpu_utilization") <= 1.0
    assert 0 < value(parsed, "nv_cpu_memory_used_bytes") <= value(parsed, "nv_cpu_memory_total_bytes")
    # the CPU budget the engines size their threads from (engines/cpu_budget.py)
    budget = cpu_budget()
    assert value(parsed, "switchyard_cpu_budget_threads", source=budget.source) == budget.threads >= 1
    assert value(parsed, "switchyard_cpu_limit") == budget.cpus > 0


def test_llm_metrics_have_vllm_names_and_buckets() -> None:
    text = render(build_metrics_registry(fake_registry())).decode()  # type: ignore[arg-type]
    parsed = samples(text)
    m = {"model": "llm"}
    assert value(parsed, "switchyard_time_to_first_token_seconds_count", **m) == 2
    assert value(parsed, "switchyard_time_to_first_token_seconds_sum", **m) == pytest.approx(0.203)
    assert value(parsed, "switchyard_time_to_first_token_seconds_bucket", **m, le="0.001") == 0
    assert value(parsed, "switchyard_time_to_first_token_seconds_bucket", **m, le="0.005") == 1
    assert value(parsed, "switchyard_time_to_first_token_seconds_bucket", **m, le="0.25") == 2
    assert value(parsed, "switchyard_time_to_first_token_seconds_bucket", **m, le="+Inf") == 2
    assert value(parsed, "switchyard_time_per_output_token_seconds_bucket", **m, le="0.01") == 0
    assert value(parsed, "switchyard_time_per_output_token_seconds_bucket", **m, le="0.025") == 5
    assert value(parsed, "switchyard_e2e_request_latency_seconds_bucket", **m, le="0.5") == 1
    assert value(parsed, "switchyard_e2e_request_latency_seconds_count", **m) == 2
    assert value(parsed, "switchyard_request_queue_time_seconds_count", **m) == 2
    assert value(parsed, "switchyard_prompt_tokens_total", **m) == 17
    assert value(parsed, "switchyard_generation_tokens_total", **m) == 7
    success = {
        reason: value(parsed, "switchyard_request_success_total", **m, finished_reason=reason)
        for reason in ("stop", "length", "abort")
    }
    assert success == {"stop": 1, "length": 0, "abort": 1}
    assert value(parsed, "switchyard_prefix_cache_hit_rate", **m) == 0.25
    assert value(parsed, "switchyard_num_requests_waiting", **m) == 3
    assert value(parsed, "switchyard_requests_rejected_total", **m, reason="queue_timeout") == 2
    assert value(parsed, "switchyard_requests_rejected_total", **m, reason="queue_full") == 0
    assert value(parsed, "switchyard_queue_expected_wait_seconds", **m) == 1.5
    spec = [
        value(parsed, f"switchyard_spec_decode_num_{n}_total", **m)
        for n in ("drafts", "draft_tokens", "accepted_tokens")
    ]
    assert spec == [4, 16, 9]
    assert "# TYPE switchyard_time_to_first_token_seconds histogram" in text


def test_each_app_has_its_own_registry() -> None:
    one = render(build_metrics_registry(fake_registry("llm-a", "tensor-a"))).decode()  # type: ignore[arg-type]
    two = render(build_metrics_registry(fake_registry("llm-b", "tensor-b"))).decode()  # type: ignore[arg-type]
    assert 'model="llm-a"' in one and 'model="llm-b"' not in one
    assert 'model="tensor-b"' in two and 'model="tensor-a"' not in two
    assert REGISTRY.get_sample_value("nv_cpu_utilization") is None  # prometheus_client's global one is untouched


async def test_dynamic_batcher_counts_failures_by_triton_reason() -> None:
    rules = QueueRules(timeout_action="REJECT", default_timeout_s=0.15, allow_timeout_override=True, max_queue_size=2)
    batcher, held = await started_held(BatchingPolicy(max_batch_size=1, dynamic=True, queue_rules={0: rules}))
    try:
        running = asyncio.create_task(batcher.infer(request(0), timeout_us=2_000_000))
        await until(held.busy.is_set)  # in the backend until released
        expiring = asyncio.create_task(batcher.infer(request(1)))  # times out in the queue: REJECTED
        cancelled = asyncio.create_task(batcher.infer(request(2), timeout_us=2_000_000))
        await asyncio.sleep(0.01)
        with pytest.raises(RateLimitError):  # the queue (2) is full: REJECTED
            await batcher.infer(request(3))
        cancelled.cancel()  # the client goes away while queued: CANCELED
        with pytest.raises(ServiceUnavailableError, match="timed out"):
            await expiring
        held.release.set()
        await running
        assert batcher.stats.fail_reasons == {"REJECTED": 2, "CANCELED": 1}
        assert batcher.stats.fail.count == 3 and batcher.stats.success.count == 1
    finally:
        held.release.set()
        await batcher.stop()

    failing = DynamicBatcher("failing", [_Failing()], BatchingPolicy(max_batch_size=4))  # type: ignore[list-item]
    await failing.start()
    try:
        with pytest.raises(InternalError):
            await failing.infer(request(1))
        assert failing.stats.fail_reasons == {"BACKEND": 1}
    finally:
        await failing.stop()
