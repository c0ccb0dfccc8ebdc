"""The memory budget (resident_memory.py) over real tiny python-backend models: LRU eviction that never takes a
model in use, refusal with the figures of a model too large for the budget, and a load's reservation of its peak."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from gateway.errors import ServiceUnavailableError
from gateway.repository.model_use import close_use, open_use
from gateway.repository.resident_memory import ModelTooLargeError
from tests.gateway.repository.residency_harness import Clock, control_of, repo_of, start, tag


async def test_lru_idle_model_is_evicted_to_make_room(tmp_path: Path, clock: Clock, started: list) -> None:
    sizes = {"a": 100, "b": 100, "c": 100}
    control = await start(control_of(repo_of(tmp_path, "a", "b", "c"), clock, sizes, budget=250), started)
    await tag(control, "a")
    clock.now += 1
    await tag(control, "b")
    clock.now += 1
    await tag(control, "a")  # a is now the most recently used
    clock.now += 1
    await tag(control, "c")
    assert sorted(control.residency.memory.resident) == ["a", "c"]
    assert control.residency.memory.stats.evictions == {("b", "memory"): 1}
    assert control.residency.memory.stats.unloads == {("b", "memory"): 1}
    assert control.residency.memory.used_bytes() <= 250


async def test_a_model_in_use_is_never_evicted(tmp_path: Path, clock: Clock, started: list) -> None:
    sizes = {"a": 100, "b": 100}
    control = await start(
        control_of(repo_of(tmp_path, "a", "b"), clock, sizes, budget=150, load_timeout_s=0.5), started
    )
    use = open_use()  # a request that looked "a" up and has not finished its response
    try:
        await control.models.acquire("a")
        with pytest.raises(ServiceUnavailableError) as refused:
            await control.models.acquire("b")  # waits out the load timeout: a stays busy all along
        assert refused.value.status == 503 and "busy or pinned (a)" in refused.value.message
        assert "a" in control.residency.memory.resident
    finally:
        close_use(use)
    control.residency.on_demand.load_timeout_s = 60.0  # the load below has all the time it needs on a busy machine
    waiter = asyncio.create_task(tag(control, "b"))  # now a is idle: evicted for b
    assert await waiter == "v1:b"
    assert sorted(control.residency.memory.resident) == ["b"]


async def test_a_model_too_large_for_the_budget_is_refused_with_the_figures(
    tmp_path: Path, clock: Clock, started: list
) -> None:
    control = await start(control_of(repo_of(tmp_path, "huge"), clock, {"huge": 1000}, budget=500), started)
    with pytest.raises(ModelTooLargeError) as refused:
        await control.models.acquire("huge")
    assert "needed: 1000 bytes" in refused.value.message and "budget: 500 bytes" in refused.value.message
    [row] = control.states.index()
    assert row["state"] == "UNAVAILABLE" and "needed: 1000 bytes" in row["reason"]


async def test_a_load_reserves_its_peak_then_counts_its_resident_bytes(
    tmp_path: Path, clock: Clock, started: list
) -> None:
    """b keeps 100 bytes but its load peaks at 300 (by format): a (100) is evicted for the reservation although
    both would fit once loaded; b's next load reserves the peak measured at its first (the RSS rose by 250)."""
    rss = [0]
    watched = threading.Event()  # the load's peak watch has read the risen RSS

    def read_rss() -> int:
        if rss[0] and threading.current_thread().name == "load-peak":
            watched.set()
        return rss[0]

    control = await start(
        control_of(
            repo_of(tmp_path, "a", "b"), clock, {"a": 100, "b": 100}, budget=350, peaks={"b": 300}, rss=read_rss
        ),
        started,
    )
    in_use: list[int] = []
    real = control._build

    def build(model, config):  # noqa: ANN001, ANN202 - b's load: its RSS rises until the watch has seen it
        in_use.append(control.residency.memory.used_bytes())
        if model.name == "b":
            watched.clear()
            rss[0] = 250
            assert watched.wait(timeout=30), "the peak watch never read the RSS"
            rss[0] = 0
        return real(model, config)

    control._build = build  # type: ignore[method-assign]
    await tag(control, "a")
    clock.now += 1
    await tag(control, "b")
    assert control.residency.memory.stats.evictions == {("a", "memory"): 1}
    assert in_use == [100, 300]  # a's reservation (its estimate), then b's (its peak) with a evicted
    memory = control.residency.memory
    assert memory.reserved == {} and memory.counted_bytes() == 100  # b at its resident size
    assert control.residency.memory.peaks == {"a": 0, "b": 250}
    clock.now += 1
    await tag(control, "a")  # 100 + 100 fit: b stays
    await control.unload("b")
    await tag(control, "b")
    assert in_use[-1] == 100 + 250  # a, and the peak b's first load was measured at
    assert sorted(control.residency.memory.resident) == ["a", "b"]
