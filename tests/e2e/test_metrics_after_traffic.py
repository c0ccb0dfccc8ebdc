"""Triton's nv_* and the LLM metrics on a real server: counts after real traffic must match the traffic exactly.

The server is the shared session one, so every number is a difference between a scrape before and one after.
"""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DEFAULT_MODEL, ServerProcess

EMBEDDER = "all-minilm-l6-v2"
CLASSIFIER = "circle_classifier"
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(metrics: dict, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in metrics, f"{name}{labels} not exposed"
    return metrics[key]


def delta(before: dict, after: dict, name: str, **labels: str) -> float:
    return get(after, name, **labels) - get(before, name, **labels)


def wait_idle(server: ServerProcess) -> None:
    """Earlier tests may have left a request finishing; counts are only exact from an idle server."""
    deadline = time.monotonic() + 60
    while server.metric("switchyard_num_requests_running") or server.metric("switchyard_num_requests_waiting"):
        assert time.monotonic() < deadline, "the server never became idle"
        time.sleep(0.2)


def chat(server: ServerProcess, content: str, stream: bool) -> dict[str, int]:
    """One chat completion; returns its usage."""
    body = {
        "model": DEFAULT_MODEL,
        "temperature": 0,
        "max_tokens": 6,
        "messages": [{"role": "user", "content": content}],
    }
    if not stream:
        response = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=120)
        response.raise_for_status()
        return response.json()["usage"]
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    usage = None
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                usage = json.loads(line[6:]).get("usage") or usage
    assert usage is not None
    return usage


def test_counts_match_the_traffic(server: ServerProcess) -> None:
    wait_idle(server)
    before = scrape(server.base_url)

    prompts = ["What is the capital of France?", "Name a colour.", "Count to three."]
    usages = [chat(server, p, stream=i == 2) for i, p in enumerate(prompts)]  # N = 3, one of them streamed
    for text in ("hello world", "metrics are counted"):  # M = 2
        httpx.post(
            server.base_url + "/v1/embeddings", json={"model": EMBEDDER, "input": text}, timeout=60
        ).raise_for_status()
    client = httpclient.InferenceServerClient(server.base_url.removeprefix("http://"))
    try:
        for _ in range(3):  # K = 3 requests of 4 rows each
            points = httpclient.InferInput("FEATURES", [4, 2], "FP32")
            points.set_data_from_numpy(np.zeros((4, 2), dtype=np.float32))
            client.infer(CLASSIFIER, [points])
    finally:
        client.close()
    bad = httpx.post(
        server.base_url + f"/v2/models/{CLASSIFIER}/infer",
        timeout=30,  # 3 features, the model takes 2
        json={"inputs": [{"name": "FEATURES", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]},
    )
    assert bad.status_code == 400
    unknown = httpx.post(
        server.base_url + "/v1/chat/completions",
        timeout=30,
        json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert unknown.status_code == 404  # reaches no model: counted nowhere

    wait_idle(server)
    after = scrape(server.base_url)
    llm, n = {"model": DEFAULT_MODEL}, len(prompts)
    triton_llm = {"model": DEFAULT_MODEL, "version": "1"}

    # LLM: Triton's counters ...
    assert delta(before, after, "nv_inference_request_success", **triton_llm) == n
    assert delta(before, after, "nv_inference_count", **triton_llm) == n
    assert delta(before, after, "nv_inference_exec_count", **triton_llm) == n
    assert delta(before, after, "nv_inference_request_duration_us", **triton_llm) > 0
    assert delta(before, after, "nv_inference_compute_infer_duration_us", **triton_llm) > 0
    for reason in REASONS:
        assert delta(before, after, "nv_inference_request_failure", **triton_llm, reason=reason) == 0
    # ... and vLLM's
    prompt_tokens = sum(u["prompt_tokens"] for u in usages)
    generated = sum(u["completion_tokens"] for u in usages)
    assert delta(before, after, "switchyard_prompt_tokens_total", **llm) == prompt_tokens
    assert delta(before, after, "switchyard_generation_tokens_total", **llm) == generated
    assert delta(before, after, "switchyard_time_to_first_token_seconds_count", **llm) == n
    assert delta(before, after, "switchyard_time_to_first_token_seconds_bucket", **llm, le="+Inf") == n
    assert delta(before, after, "switchyard_time_to_first_token_seconds_sum", **llm) > 0
    assert delta(before, after, "switchyard_time_per_output_token_seconds_count", **llm) == generated - n
    assert delta(before, after, "switchyard_e2e_request_latency_seconds_count", **llm) == n
    assert delta(before, after, "switchyard_request_queue_time_seconds_count", **llm) == n
    finished = sum(
        delta(before, after, "switchyard_request_success_total", **llm, finished_reason=r) for r in ("stop", "length")
    )
    assert finished == n

    # Embeddings: each request is one inference of the embedding model.
    embedder = {"model": EMBEDDER, "version": "1"}
    assert delta(before, after, "nv_inference_request_success", **embedder) == 2
    assert delta(before, after, "nv_inference_count", **embedder) == 2
    assert 1 <= delta(before, after, "nv_inference_exec_count", **embedder) <= 2

    # v2 infer: 3 successes of 4 rows in at most 3 backend calls, and the refused request.
    classifier = {"model": CLASSIFIER, "version": "1"}
    assert delta(before, after, "nv_inference_request_success", **classifier) == 3
    assert delta(before, after, "nv_inference_count", **classifier) == 12
    assert 1 <= delta(before, after, "nv_inference_exec_count", **classifier) <= 3
    assert delta(before, after, "nv_inference_queue_duration_us", **classifier) >= 0
    assert delta(before, after, "nv_inference_compute_infer_duration_us", **classifier) > 0
    failures = {r: delta(before, after, "nv_inference_request_failure", **classifier, reason=r) for r in REASONS}
    assert failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 1}

    # Gauges
    assert get(after, "nv_inference_pending_request_count", **classifier) == 0
    assert get(after, "nv_model_load_duration_secs", **triton_llm) > 0
    assert 0 < get(after, "nv_cpu_memory_used_bytes") <= get(after, "nv_cpu_memory_total_bytes")
    assert 0 <= get(after, "nv_cpu_utilization") <= 1


def test_v2_generate_counts_as_an_llm_request_on_both_ports(server: ServerProcess) -> None:
    wait_idle(server)
    before = scrape(server.base_url)
    response = httpx.post(
        server.base_url + f"/v2/models/{DEFAULT_MODEL}/generate",
        timeout=120,
        json={"text_input": "Hello", "parameters": {"max_tokens": 3, "temperature": 0}},
    )
    response.raise_for_status()
    wait_idle(server)
    after = scrape(f"http://127.0.0.1:{server.metrics_port}")  # the --metrics-port exposition is the same registry
    assert delta(before, after, "nv_inference_request_success", model=DEFAULT_MODEL, version="1") == 1
    assert delta(before, after, "switchyard_time_to_first_token_seconds_count", model=DEFAULT_MODEL) == 1
    assert 1 <= delta(before, after, "switchyard_generation_tokens_total", model=DEFAULT_MODEL) <= 3
    stats = httpx.get(server.base_url + f"/v2/models/{DEFAULT_MODEL}/stats", timeout=30).json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == get(
        scrape(server.base_url), "nv_inference_request_success", model=DEFAULT_MODEL, version="1"
    )
