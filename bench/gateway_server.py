"""The servers a bench measures: `python -m gateway serve` over a model repository on a free port (`serve`), or any
other server command (llama-server, vLLM: `start_process`), each ready once its health URL answers 200, its output
kept in a log file when one is given, stopped with `stop`.

One starter for every bench, so a change of the serve command line (a new port, a flag) is made once and the
benches measure the same server.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Started:
    """A server once ready: its process, base URL, seconds from start to ready and peak RSS (bytes, process tree)
    meanwhile."""

    proc: subprocess.Popen
    url: str
    ready_s: float
    load_peak_rss: int


def tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of `proc` and all its children."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the server drains), SIGKILL after 60 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _tail(log: Path | None) -> str:
    return f":\n{log.read_text(errors='replace')[-3000:]}" if log is not None and log.exists() else ""


def wait_ready(health: str, proc: subprocess.Popen, log: Path | None = None, timeout: float = 900) -> int:
    """Wait until GET `health` answers 200, sampling the process tree's RSS every 0.1 s; returns its peak. Raises
    RuntimeError (with the end of `log`) when the process exits or `timeout` seconds pass."""
    watched, peak = psutil.Process(proc.pid), 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        peak = max(peak, tree_rss(watched))
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode}{_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(health, timeout=1).status_code == 200:
                return max(peak, tree_rss(watched))
        time.sleep(0.1)
    raise RuntimeError(f"{proc.args[:4]} did not become ready in {timeout:.0f} s{_tail(log)}")


def start_process(
    cmd: Sequence[str],
    health: str,
    log: Path | None = None,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
) -> Started:
    """Start `cmd` (its output to `log`, or to this process's own when None) and wait until GET `health` answers
    200; a server that fails to get ready is stopped."""
    start = time.monotonic()
    out = log.open("w") if log is not None else None
    try:
        proc = subprocess.Popen(
            list(cmd),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
        )
    finally:
        if out is not None:
            out.close()  # the child holds its own descriptor
    try:
        peak = wait_ready(health, proc, log, timeout)
    except BaseException:
        stop(proc)
        raise
    base = health.split("/", 3)
    return Started(proc, "/".join(base[:3]), time.monotonic() - start, peak)


def serve(
    repository: Path,
    *flags: str,
    log: Path | None = None,
    grpc_port: int = 0,
    health: str = "/health",
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
    prefix: Sequence[str] = (),
    timeout: float = 900,
) -> Started:
    """`python -m gateway serve` over `repository` on 127.0.0.1 and a free HTTP port, with no metrics port, gRPC
    on `grpc_port` (0: off), at log level warning, `flags` appended; `prefix` goes before the command (e.g.
    `taskset -c 1`). Ready once GET `health` (a path) answers 200."""
    port = free_port()
    cmd = [*prefix, python, "-m", "gateway", "serve", "--model-repository", str(repository)]
    cmd += ["--host", HOST, "--http-port", str(port), "--metrics-port", "0", "--grpc-port", str(grpc_port)]
    cmd += ["--log-level", "warning", *flags]
    return start_process(cmd, f"http://{HOST}:{port}{health}", log, ROOT, env, timeout)
