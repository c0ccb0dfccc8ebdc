"""The Gateway API Inference Extension's model-server protocol, live: the metrics its endpoint picker scrapes from
each pod's HTTP port (/metrics) under the names the Helm chart passes it, with the protocol's types and semantics:
queued requests and running requests as gauges counting requests, KV-cache utilization as a gauge from 0 to 1
(as vLLM's `vllm:kv_cache_usage_perc`)."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DEFAULT_MODEL, ServerProcess

VALUES = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "switchyard" / "values.yaml"


def picker_metric_names() -> dict[str, str]:
    return yaml.safe_load(VALUES.read_text())["inferencePool"]["endpointPicker"]["metrics"]


def scrape(server: ServerProcess) -> dict[str, tuple[str, float]]:
    """name -> (type, value of the default model's sample), from the HTTP port the picker scrapes."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") == DEFAULT_MODEL and sample.name == family.name:
                out[family.name] = (family.type, sample.value)
    return out


def test_the_protocol_metrics_are_gauges_with_its_semantics(server: ServerProcess) -> None:
    names = picker_metric_names()
    body = {
        "model": DEFAULT_MODEL,
        "prompt": "Once upon a time, " * 40,
        "max_tokens": 64,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=120) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # the request is decoding now
        busy = scrape(server)
    for key in ("queuedRequests", "runningRequests", "kvCacheUsage"):
        kind, value = busy[names[key]]
        assert kind == "gauge", (names[key], kind)
        assert value >= 0
    assert busy[names["runningRequests"]][1] >= 1 and busy[names["queuedRequests"]][1].is_integer()
    assert 0 < busy[names["kvCacheUsage"]][1] <= 1  # a fraction of the pool, not a percentage
