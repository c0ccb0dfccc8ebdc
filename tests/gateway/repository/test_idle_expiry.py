"""Keep-alive expiry (idle_expiry.py) on an injected clock over real tiny python-backend models: idle models
unload past their keep-alive, busy and pinned ones stay, and admin loads keep theirs."""

from __future__ import annotations

from pathlib import Path

from gateway.repository.model_use import close_use, open_use
from tests.gateway.repository.residency_harness import Clock, control_of, repo_of, start, tag


async def test_keep_alive_expiry_on_the_injected_clock(tmp_path: Path, clock: Clock, started: list) -> None:
    repo_of(tmp_path, "a", "b")
    repo_of(tmp_path, "pinned", extra="keep_alive: -1\n")
    control = await start(control_of(tmp_path, clock), started)
    for name in ("a", "b", "pinned"):
        await tag(control, name)
    use = open_use()
    await control.models.acquire("b")  # b is in use past its keep-alive: it stays
    clock.now += 59
    left = control.residency.expiry.seconds_left
    assert (left("a"), left("b"), left("pinned"), left("nope")) == (1.0, 60.0, None, None)  # busy: all of it
    assert await control.residency.expiry.expire_idle() == []
    clock.now += 2
    assert await control.residency.expiry.expire_idle() == ["a"]
    assert control.models.find("a") is None and control.residency.memory.stats.evictions == {("a", "idle"): 1}
    close_use(use)  # b's idle clock starts now
    clock.now += 59
    assert await control.residency.expiry.expire_idle() == []
    clock.now += 2
    assert await control.residency.expiry.expire_idle() == ["b"]
    clock.now += 10**6
    assert await control.residency.expiry.expire_idle() == []  # keep_alive: -1 pins
    assert sorted(control.residency.memory.resident) == ["pinned"]
    assert await tag(control, "a") == "v1:a"  # an expired model loads again on its next request


async def test_admin_loads_follow_keep_alive_unless_pinned(tmp_path: Path, clock: Clock, started: list) -> None:
    control = await start(control_of(repo_of(tmp_path, "a", "b"), clock), started)
    await control.load("a")
    await control.load("b", keep_alive=-1.0)
    clock.now += 61
    assert await control.residency.expiry.expire_idle() == ["a"]
    assert control.residency.memory.resident["b"].pinned
    await control.unload("b")
    assert control.residency.memory.stats.unloads == {("a", "idle"): 1, ("b", "admin"): 1}
