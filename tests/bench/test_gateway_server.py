"""The benches' server starter: ready on its health URL, stopped cleanly, and a server that dies says why."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from bench.gateway_server import free_port, start_process, stop


def test_a_server_is_ready_once_its_health_url_answers_and_stops(tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    server = start_process(cmd, f"http://127.0.0.1:{port}/", tmp_path / "server.log", cwd=tmp_path, timeout=60)
    try:
        assert server.url == f"http://127.0.0.1:{port}"
        assert httpx.get(server.url + "/").status_code == 200
        assert server.ready_s > 0 and server.load_peak_rss > 0
    finally:
        stop(server.proc)
    assert server.proc.returncode is not None


def test_a_server_that_exits_raises_with_the_end_of_its_log(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "print('no model repository here', flush=True); raise SystemExit(3)"]
    with pytest.raises(RuntimeError, match=r"(?s)exited with 3.*no model repository here"):
        start_process(cmd, f"http://127.0.0.1:{free_port()}/health", tmp_path / "server.log", cwd=tmp_path)
