"""Loading on request (on_demand.py) over real tiny python-backend models: one load however many first requests
arrive, failures answered to every waiter, 404 for names the repository does not load on request, a load that waits
for a busy model to let the budget go, the request's deadline, and the request's keep_alive."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from gateway.errors import ModelNotFoundError
from gateway.repository.model_use import close_use, open_use
from gateway.repository.on_demand import ModelLoadFailedError, ModelLoadTimeoutError
from tests.gateway.repository.residency_harness import Clock, control_of, count_builds, repo_of, start, tag
from tests.gateway.repository.tiny_models import write_tagger


async def test_sixteen_first_requests_cause_one_load(tmp_path: Path, clock: Clock, started: list) -> None:
    control = await start(control_of(repo_of(tmp_path, "a"), clock), started)
    assert control.models.all_models() == []  # on_demand: nothing at startup
    builds = count_builds(control, delay=0.3)
    entries = await asyncio.gather(*(control.models.acquire("a") for _ in range(16)))
    assert builds == ["a"] and len({id(e) for e in entries}) == 1
    assert control.residency.memory.stats.loads == {("a", "success"): 1}
    assert await tag(control, "a") == "v1:a"


async def test_a_failed_load_answers_every_waiter_with_its_reason(tmp_path: Path, clock: Clock, started: list) -> None:
    folder = write_tagger(tmp_path, "broken")
    (folder / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n"
        "        raise RuntimeError('weights are corrupt')\n"
        "    def execute(self, requests):\n        return []\n"
    )
    control = await start(control_of(tmp_path, clock), started)
    results = await asyncio.gather(*(control.models.acquire("broken") for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, ModelLoadFailedError) for r in results), results
    assert all("weights are corrupt" in r.message and r.status == 500 for r in results)
    [row] = control.states.index()
    assert row["state"] == "UNAVAILABLE" and "weights are corrupt" in row["reason"]
    assert control.residency.memory.stats.loads == {("broken", "failure"): 1}  # one attempt for the five


async def test_unknown_names_are_404_and_other_modes_do_not_load_on_request(
    tmp_path: Path, clock: Clock, started: list
) -> None:
    control = await start(control_of(repo_of(tmp_path, "a"), clock), started)
    with pytest.raises(ModelNotFoundError):
        await control.models.acquire("nope")
    explicit = await start(control_of(tmp_path, clock, mode="explicit"), started)
    with pytest.raises(ModelNotFoundError):
        await explicit.models.acquire("a")  # explicit mode: only the repository API loads


async def test_load_on_request_in_triton_modes(tmp_path: Path, clock: Clock, started: list) -> None:
    repo_of(tmp_path, "always")
    repo_of(tmp_path, "lazy", extra="load: on_request\nkeep_alive: 30s\n")
    control = await start(control_of(tmp_path, clock, mode="none"), started)
    assert [m.name for m in control.models.all_models()] == ["always"]
    assert await tag(control, "lazy") == "v1:lazy"
    assert control.residency.memory.resident["lazy"].keep_alive == 30
    assert control.residency.memory.resident["always"].pinned  # Triton's modes keep what they load at startup
    await control.models.acquire("always", keep_alive=0.0)  # a request's keep_alive does not change that
    assert control.residency.memory.resident["always"].pinned
    clock.now += 31
    assert await control.residency.expiry.expire_idle() == ["lazy"]


async def test_a_load_waits_for_a_busy_model_to_finish(tmp_path: Path, clock: Clock, started: list) -> None:
    sizes = {"a": 100, "b": 100}
    control = await start(control_of(repo_of(tmp_path, "a", "b"), clock, sizes, budget=150), started)
    use = open_use()
    await control.models.acquire("a")
    waiter = asyncio.create_task(control.models.acquire("b"))
    async with asyncio.timeout(10):
        while "b" not in control.residency.on_demand._no_room and not waiter.done():  # b's load tried and found no room
            await asyncio.sleep(0.01)
    assert not waiter.done()  # held by the request using a
    close_use(use)
    assert (await asyncio.wait_for(waiter, 10)).name == "b"


async def test_the_request_deadline_bounds_its_wait_for_a_load(tmp_path: Path, clock: Clock, started: list) -> None:
    control = await start(control_of(repo_of(tmp_path, "a"), clock), started)
    loaded = threading.Event()
    count_builds(control, gate=loaded)  # the load lasts until the request has given up
    use = open_use(time.monotonic() + 0.2)
    try:
        with pytest.raises(ModelLoadTimeoutError) as late:
            await control.models.acquire("a")
    finally:
        close_use(use)
        loaded.set()
    assert late.value.status == 504 and "request's timeout" in late.value.message
    assert (await control.models.acquire("a")).name == "a"  # the load went on for the next request


async def test_a_request_keep_alive_replaces_the_model_s(tmp_path: Path, clock: Clock, started: list) -> None:
    control = await start(control_of(repo_of(tmp_path, "a"), clock), started)
    await control.models.acquire("a", keep_alive=0.0)  # Ollama's keep_alive: 0 unloads once idle
    assert await control.residency.expiry.expire_idle() == ["a"]
