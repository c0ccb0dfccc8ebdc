"""Switchyard on Ray Serve: N replicas, each running its own `switchyard serve` (its own engine), behind an ingress
that keeps a session (or a long shared prompt prefix) on one replica.

    serve run gateway.server.ray_serve:build_app model_repository=/models min_replicas=1 max_replicas=4

Two deployments:

* `SwitchyardEngine`: each replica starts `python -m gateway serve` on a free 127.0.0.1 port with the repository
  and relays HTTP requests to it, streaming. Ray's health check fails when that server dies, so Ray replaces the
  replica; the server dies with its replica (PR_SET_PDEATHSIG). Autoscaling runs on ongoing requests per replica
  (`target_ongoing_requests`), Ray Serve's default signal.
* `SwitchyardIngress`: the HTTP entry. It reads the route key of a request (its `X-Session-ID` header or
  `session_id` field, else the first `prefix_chars` characters of a long prompt) and calls the engine deployment
  with it; `SessionAffinityRouter` ranks the replicas for that key by rendezvous hashing, so a key keeps its
  replica while the replica set is unchanged, and overflows to the next replica only when its replica is full
  (`max_ongoing_requests`). Requests without a key go to the least loaded replica (Ray's power of two choices).

The replica that answered is named in the `x-switchyard-replica` response header.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from ray import serve
from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

ROOT = Path(__file__).resolve().parents[2]
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
REPLICA_HEADER = "x-switchyard-replica"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child before exec (Linux): SIGTERM when the replica process exits
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def route_key(headers: dict[str, str], body: bytes, prefix_chars: int) -> str | None:
    """The session id, else the start of a long prompt (the part tenants share), else None."""
    session = headers.get("x-session-id")
    if session:
        return f"session:{session}"
    try:
        obj = json.loads(body) if body else None
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("session_id"), str) and obj["session_id"]:
        return f"session:{obj['session_id']}"
    prompt = obj.get("prompt")
    if prompt is None and isinstance(obj.get("messages"), list):
        prompt = json.dumps(obj["messages"], ensure_ascii=False)  # the system message comes first
    text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    if prefix_chars and len(text) >= prefix_chars:
        return "prefix:" + hashlib.blake2b(text[:prefix_chars].encode(), digest_size=8).hexdigest()
    return None


class SessionAffinityRouter(FIFOMixin, RequestRouter):
    """Ranks replicas for a request's `route_key` by rendezvous hashing; no key: the least loaded of two."""

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        key = pending_request.kwargs.get("route_key") if pending_request is not None else None
        if not key:
            return [candidate_replicas]  # Ray's default choice among them: power of two, by queue length

        def weight(replica: RunningReplica) -> bytes:
            return hashlib.blake2b(f"{key}\0{replica.replica_id.unique_id}".encode(), digest_size=8).digest()

        ranked = sorted(candidate_replicas, key=weight, reverse=True)
        return [[replica] for replica in ranked]  # the next one only when the first is full


@serve.deployment(
    request_router_config={"request_router_class": "gateway.server.ray_serve:SessionAffinityRouter"},
    max_ongoing_requests=32,
    health_check_period_s=2,
    health_check_timeout_s=10,
    ray_actor_options={"num_cpus": 0.5},
)
class SwitchyardEngine:
    def __init__(self, model_repository: str, threads: int = 1, startup_timeout_s: float = 600) -> None:
        self.port = _free_port()
        self.replica = serve.get_replica_context().replica_id.unique_id
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(threads),
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        }
        cmd = [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--model-repository",
            model_repository,
            "--host",
            "127.0.0.1",
            "--http-port",
            str(self.port),
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--no-console",
            "--log-level",
            "warning",
        ]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, preexec_fn=_die_with_parent)  # noqa: PLW1509
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"switchyard serve exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.base}/v2/health/ready", timeout=5) as resp:  # our own server
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("switchyard serve did not become ready")
            time.sleep(0.5)
        self.session: aiohttp.ClientSession | None = None

    async def forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes, route_key: str | None = None
    ) -> AsyncIterator[Any]:
        """Relay one request: yields (status, headers) first, then the body's bytes as they come."""
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=600))
        send = {k: v for k, v in headers.items() if k.lower() not in HOP_HEADERS}
        async with self.session.request(method, f"{self.base}{path}", headers=send, data=body) as resp:
            out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
            out[REPLICA_HEADER] = self.replica
            yield resp.status, out
            async for chunk in resp.content.iter_any():
                yield chunk

    def check_health(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"switchyard serve exited with {self.proc.returncode}")

    def __del__(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=1000)
class SwitchyardIngress:
    def __init__(self, engine: Any, prefix_chars: int = 1024) -> None:
        self.engine = engine.options(stream=True)
        self.prefix_chars = prefix_chars

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        key = route_key(headers, body, self.prefix_chars) if request.method == "POST" else None
        stream = self.engine.forward.remote(request.method, path, headers, body, route_key=key)
        status, out = await stream.__anext__()

        async def rest() -> AsyncIterator[bytes]:
            async for chunk in stream:
                yield chunk

        if "text/event-stream" in out.get("Content-Type", out.get("content-type", "")):
            return StreamingResponse(rest(), status_code=status, headers=out)
        data = b"".join([chunk async for chunk in rest()])
        return Response(data, status_code=status, headers=out)


def build_app(args: dict[str, str]) -> serve.Application:
    """`serve run gateway.server.ray_serve:build_app model_repository=... [replicas=N | min_replicas=.. max_replicas=..]
    [target_ongoing_requests=8] [threads=1] [prefix_chars=1024] [num_cpus=1]`."""
    repository = args.get("model_repository", "model_repository")
    if not Path(repository).is_dir():
        raise ValueError(f"model_repository={repository!r} is not a folder; give a Switchyard model repository")
    options: dict[str, Any] = {"ray_actor_options": {"num_cpus": float(args.get("num_cpus", 0.5))}}
    if "replicas" in args:
        options["num_replicas"] = int(args["replicas"])
    else:
        options["autoscaling_config"] = {
            "min_replicas": int(args.get("min_replicas", 1)),
            "max_replicas": int(args.get("max_replicas", 4)),
            "target_ongoing_requests": float(args.get("target_ongoing_requests", 8)),
        }
    engine = SwitchyardEngine.options(**options).bind(str(Path(repository).resolve()), int(args.get("threads", 1)))
    return SwitchyardIngress.bind(engine, int(args.get("prefix_chars", 1024)))
