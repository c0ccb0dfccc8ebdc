"""Switchyard on Ray Serve, on a local Ray cluster started here (CPU only, 2 CPUs): two replicas, each with its
own engine, answer the openai SDK; a session's turns land on one replica; a replica killed mid-traffic is replaced
and new requests succeed. One cluster start for the module; tiny KV pools and one thread per replica."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, free_port, smollm2_config

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ray[serve]')")
serve = pytest.importorskip("ray.serve")

from gateway.server.ray_serve import REPLICA_HEADER, build_app, route_key  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
LLM_CONFIG = smollm2_config(2048, "pytorch:\n  gemm_threads: 1\n")


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("ray_repository")
    (repo / DEFAULT_MODEL).mkdir()
    (repo / DEFAULT_MODEL / "config.yaml").write_text(LLM_CONFIG)
    ray.init(
        num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}}
    )
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(
            build_app({"model_repository": str(repo), "replicas": "2", "num_cpus": "0.5"}),
            name="switchyard",
            route_prefix="/",
        )
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def ask(client: openai.OpenAI, text: str, session: str | None = None) -> str:
    """One chat turn; the replica that answered."""
    raw = client.chat.completions.with_raw_response.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": text}],
        max_tokens=2,
        extra_headers={"X-Session-ID": session} if session else None,
    )
    assert raw.parse().choices[0].message.content is not None
    return raw.headers[REPLICA_HEADER]


def replicas() -> dict[str, str]:
    """Live engine replicas: unique id -> actor name."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == "serve"]
    return {n.rsplit("#", 1)[-1]: n for n in names if "#SwitchyardEngine#" in n}


def test_two_replicas_answer_and_a_session_stays_on_one(base_url: str) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    pinned = {s: ask(client, f"Turn 1 of {s}", session=s) for s in ("alpha", "beta", "gamma", "delta", "epsilon")}
    assert len(set(pinned.values())) == 2, pinned  # 5 sessions hash onto both replicas (2^-4 chance otherwise)
    for turn in range(2, 4):
        for session, replica in pinned.items():
            assert ask(client, f"Turn {turn} of {session}", session=session) == replica


def test_a_replica_killed_mid_traffic_is_replaced(base_url: str) -> None:
    before = replicas()
    assert len(before) == 2, before
    victim = sorted(before)[0]

    async def traffic() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300
        ) as client:

            async def one(i: int) -> str:
                try:
                    await client.completions.create(model=DEFAULT_MODEL, prompt=f"Count {i}:", max_tokens=24)
                    return "done"
                except openai.APIError as exc:
                    return f"failed: {exc}"

            tasks = [asyncio.create_task(one(i)) for i in range(4)]
            await asyncio.sleep(1.0)
            ray.kill(ray.get_actor(before[victim], namespace="serve"), no_restart=True)
            return await asyncio.gather(*tasks)

    outcomes = asyncio.run(traffic())
    assert len(outcomes) == 4  # every request ended (some may fail with the replica): nothing hangs
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        now = replicas()
        if len(now) == 2 and victim not in now:
            break
        time.sleep(2)
    assert len(now) == 2 and victim not in now, now  # Ray started a new replica in its place
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    served = {ask(client, f"After the kill {i}", session=f"s{i}") for i in range(6)}
    assert served <= set(now) and victim not in served


def test_route_keys() -> None:
    assert route_key({"x-session-id": "a"}, b"{}", 10) == "session:a"
    assert route_key({}, b'{"session_id": "b"}', 10) == "session:b"
    long = b'{"prompt": "' + b"x" * 40 + b'"}'
    assert route_key({}, long, 10) == route_key({}, long.replace(b'x"}', b'y"}'), 10)  # same start, same key
    assert route_key({}, b'{"prompt": "short"}', 10) is None
    assert route_key({}, b"not json", 10) is None
