"""The model lifecycle on demand (residency.py) over real tiny python-backend models: one load however many first
requests arrive, failures answered to every waiter, LRU eviction under a memory budget that never takes a model in
use, keep-alive expiry on an injected clock, deadlines, and startup failures that no longer stop the server."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gateway.errors import ConfigError, ModelNotFoundError, ServiceUnavailableError
from gateway.repository.model_control import ModelControl
from gateway.repository.model_use import close_use, open_use
from gateway.repository.residency import (
    ModelLoadFailedError,
    ModelLoadTimeoutError,
    ModelTooLargeError,
)
from tests.gateway.repository.tiny_models import write_tagger, x_input


class Clock:
    """The keep-alive and recency clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def repo_of(root: Path, *names: str, extra: str = "") -> Path:
    for name in names:
        folder = write_tagger(root, name, tag=name)
        if extra:
            config = folder / "config.yaml"
            config.write_text(config.read_text() + extra)
    return root


def control_of(
    repo: Path,
    clock: Clock,
    sizes: dict[str, int] | None = None,
    budget: int = 10**9,
    mode: str = "on_demand",
    peaks: dict[str, int] | None = None,
    rss: Callable[[], int] = lambda: 0,
    **kwargs,
) -> ModelControl:
    """Model control whose memory is counted from `sizes` (bytes per folder), whose loads peak at `peaks` (bytes
    per folder, by format) and whose RSS reads `rss` (0)."""
    estimate: Callable = lambda model, config: (sizes or {}).get(model.name, 0)  # noqa: E731
    peak: Callable = lambda model, config: (peaks or {}).get(model.name, 0)  # noqa: E731
    return ModelControl(
        repo,
        control_mode=mode,
        memory_budget=budget,
        keep_alive_s=60,
        drain_timeout_s=5,
        residency={"clock": clock, "rss": rss, "estimate": estimate, "peak": peak},
        **kwargs,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def started() -> AsyncIterator[list[ModelControl]]:
    """Controls to start (prepare, load startup models, start) and close after the test."""
    controls: list[ModelControl] = []
    yield controls
    for control in controls:
        await control.close()
        for model in control.models.all_models():
            await model.stop()


async def start(control: ModelControl, started: list[ModelControl]) -> ModelControl:
    started.append(control)
    control.prepare()
    await control.start_all(control.load_all())
    return control


async def tag(control: ModelControl, name: str) -> str:
    model = await control.models.acquire(name)
    _, outputs = await model.tensor.infer([x_input()])
    return next(o for o in outputs if o.name == "TAG").array[0, 0].decode()


def count_builds(control: ModelControl, delay: float = 0.0, gate: threading.Event | None = None) -> list[str]:
    """Record each build (a load's blocking part), made slower by `delay` seconds so requests pile up, or held
    until the test sets `gate`."""
    builds: list[str] = []
    real = control._build

    def build(model, config):  # noqa: ANN001, ANN202
        builds.append(model.name)
        time.sleep(delay)
        if gate is not None:
            gate.wait(timeout=30)
        return real(model, config)

    control._build = build  # type: ignore[method-assign]
    return builds


async def test_sixteen_first_requests_cause_one_load(tmp_path: Path, clock: Clock, started: list) -> None:
    control = await start(control_of(repo_of(tmp_path, "a"), clock), started)
    assert control.models.all_models() == []  # on_demand: nothing at startup
    builds = count_builds(control, delay=0.3)
    entries = await asyncio.gather(*(control.models.acquire("a") for _ in range(16)))
    assert builds == ["a"] and len({id(e) for e in entries}) == 1
    assert control.residency.stats.loads == {("a", "success"): 1}
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
    assert control.residency.stats.loads == {("broken", "failure"): 1}  # one attempt for the five


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
    assert control.residency.resident["lazy"].keep_alive == 30
    assert control.residency.resident["always"].pinned  # Triton's modes keep what they load at startup
    await control.models.acquire("always", keep_alive=0.0)  # a request's keep_alive does not change that
    assert control.residency.resident["always"].pinned
    clock.now += 31
    assert await control.residency.expire_idle() == ["lazy"]


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
    assert sorted(control.residency.resident) == ["a", "c"]
    assert control.residency.stats.evictions == {("b", "memory"): 1}
    assert control.residency.stats.unloads == {("b", "memory"): 1}
    assert control.residency.used_bytes() <= 250


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
        assert "a" in control.residency.resident
    finally:
        close_use(use)
    control.residency.load_timeout_s = 60.0  # the load below has all the time it needs on a busy machine
    waiter = asyncio.create_task(tag(control, "b"))  # now a is idle: evicted for b
    assert await waiter == "v1:b"
    assert sorted(control.residency.resident) == ["b"]


async def test_a_load_waits_for_a_busy_model_to_finish(tmp_path: Path, clock: Clock, started: list) -> None:
    sizes = {"a": 100, "b": 100}
    control = await start(control_of(repo_of(tmp_path, "a", "b"), clock, sizes, budget=150), started)
    use = open_use()
    await control.models.acquire("a")
    waiter = asyncio.create_task(control.models.acquire("b"))
    async with asyncio.timeout(10):
        while "b" not in control.residency._no_room and not waiter.done():  # b's load tried and found no room
            await asyncio.sleep(0.01)
    assert not waiter.done()  # held by the request using a
    close_use(use)
    assert (await asyncio.wait_for(waiter, 10)).name == "b"


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
        in_use.append(control.residency.used_bytes())
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
    assert control.residency.stats.evictions == {("a", "memory"): 1}
    assert in_use == [100, 300]  # a's reservation (its estimate), then b's (its peak) with a evicted
    assert control.residency.reserved == {} and control.residency.counted_bytes() == 100  # b at its resident size
    assert control.residency.peaks == {"a": 0, "b": 250}
    clock.now += 1
    await tag(control, "a")  # 100 + 100 fit: b stays
    await control.unload("b")
    await tag(control, "b")
    assert in_use[-1] == 100 + 250  # a, and the peak b's first load was measured at
    assert sorted(control.residency.resident) == ["a", "b"]


async def test_keep_alive_expiry_on_the_injected_clock(tmp_path: Path, clock: Clock, started: list) -> None:
    repo_of(tmp_path, "a", "b")
    repo_of(tmp_path, "pinned", extra="keep_alive: -1\n")
    control = await start(control_of(tmp_path, clock), started)
    for name in ("a", "b", "pinned"):
        await tag(control, name)
    use = open_use()
    await control.models.acquire("b")  # b is in use past its keep-alive: it stays
    clock.now += 59
    left = control.residency.seconds_left
    assert (left("a"), left("b"), left("pinned"), left("nope")) == (1.0, 60.0, None, None)  # busy: all of it
    assert await control.residency.expire_idle() == []
    clock.now += 2
    assert await control.residency.expire_idle() == ["a"]
    assert control.models.find("a") is None and control.residency.stats.evictions == {("a", "idle"): 1}
    close_use(use)  # b's idle clock starts now
    clock.now += 59
    assert await control.residency.expire_idle() == []
    clock.now += 2
    assert await control.residency.expire_idle() == ["b"]
    clock.now += 10**6
    assert await control.residency.expire_idle() == []  # keep_alive: -1 pins
    assert sorted(control.residency.resident) == ["pinned"]
    assert await tag(control, "a") == "v1:a"  # an expired model loads again on its next request


async def test_admin_loads_follow_keep_alive_unless_pinned(tmp_path: Path, clock: Clock, started: list) -> None:
    control = await start(control_of(repo_of(tmp_path, "a", "b"), clock), started)
    await control.load("a")
    await control.load("b", keep_alive=-1.0)
    clock.now += 61
    assert await control.residency.expire_idle() == ["a"]
    assert control.residency.resident["b"].pinned
    await control.unload("b")
    assert control.residency.stats.unloads == {("a", "idle"): 1, ("b", "admin"): 1}


async def test_a_request_keep_alive_replaces_the_model_s(tmp_path: Path, clock: Clock, started: list) -> None:
    control = await start(control_of(repo_of(tmp_path, "a"), clock), started)
    await control.models.acquire("a", keep_alive=0.0)  # Ollama's keep_alive: 0 unloads once idle
    assert await control.residency.expire_idle() == ["a"]


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


async def test_startup_failures_are_reported_and_the_others_serve(tmp_path: Path, clock: Clock, started: list) -> None:
    repo_of(tmp_path, "good")
    bad = write_tagger(tmp_path, "bad")
    (bad / "config.yaml").write_text((bad / "config.yaml").read_text() + "max_batch_sise: 3\n")
    control = await start(control_of(tmp_path, clock, mode="none"), started)
    assert [m.name for m in control.models.all_models()] == ["good"]
    row = next(r for r in control.states.index() if r["name"] == "bad")
    assert row["state"] == "UNAVAILABLE" and "max_batch_sise" in row["reason"]
    strict = control_of(tmp_path, clock, mode="none", exit_on_error=True)
    with pytest.raises(ConfigError, match=r"(?s)model 'bad' failed to load: .*max_batch_sise.*--exit-on-error"):
        strict.prepare()


async def test_the_load_api_takes_a_keep_alive(tmp_path: Path, clock: Clock, started: list) -> None:
    from gateway.errors import InvalidRequestError
    from gateway.kserve.data_plane import DataPlane

    control = await start(control_of(repo_of(tmp_path, "a"), clock), started)
    plane = DataPlane(control.models, control)
    await plane.load("a", {"keep_alive": -1})
    assert control.residency.resident["a"].pinned
    await plane.load("a", {"keep_alive": "2m"})  # a reload: its keep-alive from now on
    assert control.residency.resident["a"].keep_alive == 120
    with pytest.raises(InvalidRequestError, match="parameter 'keep_alive': 'later' is not a duration"):
        await plane.load("a", {"keep_alive": "later"})
