"""Residency (residency.py) as model control wires it over real tiny python-backend models: what a folder's
residency shows (/v1/models, the console), and its parts (the budget, the loader, the keep-alive) sharing the same
resident models."""

from __future__ import annotations

from pathlib import Path

from gateway.repository.lifecycle_config import describe_keep_alive
from gateway.repository.model_use import close_use, open_use
from tests.gateway.repository.residency_harness import Clock, control_of, repo_of, start, tag


async def test_describe_shows_a_folder_s_residency(tmp_path: Path, clock: Clock, started: list) -> None:
    control = await start(control_of(repo_of(tmp_path, "a"), clock, {"a": 100}), started)
    residency = control.residency
    assert residency.describe("a") == {"loading": False}  # on_demand: not loaded yet
    await tag(control, "a")
    clock.now += 20
    assert residency.describe("a") == {
        "resident_bytes": 100,
        "keep_alive": describe_keep_alive(60),
        "pinned": False,
        "busy": False,
        "expires_in_s": 40.0,
    }
    use = open_use()
    try:
        await control.models.acquire("a")  # held by a request: busy, its keep-alive waits
        shown = residency.describe("a")
        assert shown["busy"] and shown["expires_in_s"] is None
        assert residency.memory.resident["a"].holds == 1 and residency.expiry.seconds_left("a") == 60
    finally:
        close_use(use)
    assert residency.memory.resident["a"].holds == 0 and not residency.describe("a")["busy"]


async def test_the_parts_share_the_resident_models(tmp_path: Path, clock: Clock, started: list) -> None:
    control = await start(control_of(repo_of(tmp_path, "a"), clock), started)
    residency = control.residency
    assert control.models.on_demand is residency.on_demand  # the registry's acquire loads through it
    assert residency.on_demand.memory is residency.memory and residency.expiry.memory is residency.memory
    await tag(control, "a")
    clock.now += 61
    assert await residency.expiry.expire_idle() == ["a"]
    assert residency.memory.resident == {} and residency.memory.stats.unloads == {("a", "idle"): 1}
