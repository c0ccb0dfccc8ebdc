"""Health endpoints and the Prometheus exposition on both ports."""

from __future__ import annotations

import httpx

from tests.conftest import DEFAULT_MODEL, ServerProcess


def test_health_endpoints(server: ServerProcess) -> None:
    for path in ("/health", "/v2/health/ready", "/v2/health/live"):
        assert httpx.get(server.base_url + path).status_code == 200
    assert httpx.get(server.base_url + "/version").json()["version"]


def test_metrics_on_http_and_metrics_port(server: ServerProcess) -> None:
    httpx.post(
        server.base_url + "/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 2}, timeout=60
    ).raise_for_status()
    for url in (server.base_url, f"http://127.0.0.1:{server.metrics_port}"):
        text = httpx.get(url + "/metrics").text
        assert f'switchyard_num_requests_running{{model="{DEFAULT_MODEL}"}} 0.0' in text
        assert f'switchyard_kv_cache_blocks_used{{model="{DEFAULT_MODEL}"}} ' in text  # sessions may pin blocks
        steps = [line for line in text.splitlines() if line.startswith("switchyard_engine_steps_total")]
        assert steps and float(steps[0].split()[-1]) > 0


def test_cpu_budget_is_logged_at_startup_and_exported(server: ServerProcess) -> None:
    """The budget the engine sized its threads from, and why, in the log and in /metrics (engines/cpu_budget.py)."""
    log = server.log_path.read_text()  # the whole log: startup is at its head
    assert "CPU budget: " in log and "native engine: CPU budget " in log
    text = httpx.get(server.base_url + "/metrics").text
    threads = [line for line in text.splitlines() if line.startswith("switchyard_cpu_budget_threads{")]
    limit = [line for line in text.splitlines() if line.startswith("switchyard_cpu_limit ")]
    assert threads and float(threads[0].split()[-1]) >= 1 and 'source="' in threads[0]
    assert limit and float(limit[0].split()[-1]) > 0
