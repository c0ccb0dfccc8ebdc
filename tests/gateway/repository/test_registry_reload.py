"""Reload and unload without dropping requests: the new copy starts while the old one serves, the swap is atomic,
the old copy stops only after its in-flight requests finish (or the drain timeout)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engines.types import GenerationOutput, GenerationRequest, SamplingParams
from gateway.errors import InvalidRequestError, ModelNotFoundError, ServiceUnavailableError
from gateway.repository.loaded_model import LoadedLLM, LoadedModel
from gateway.repository.model_control import ModelControl
from gateway.repository.serving import ServingScheduler
from gateway.scheduler.llm.interface import LLMScheduler, SchedulerStats
from tests.gateway.repository.tiny_models import set_tag, write_tagger, x_input


def tag(outputs: list) -> str:
    return next(o for o in outputs if o.name == "TAG").array[0, 0].decode()


async def infer_tag(model: LoadedModel) -> str:
    _, outputs = await model.tensor.infer([x_input()])
    return tag(outputs)


@pytest.fixture
async def registry(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[ModelControl]:
    """The tagger, serving; its batches take 0.3 s (so requests are in flight), or the seconds a test passes as
    the fixture's parameter."""
    repo = tmp_path / "repo"
    write_tagger(repo, "tagger", tag="a", delay=getattr(request, "param", 0.3))
    reg = ModelControl(repo, control_mode="explicit", load_models=["*"], drain_timeout_s=10)
    reg.prepare()
    for model in reg.load_all():
        await model.start()
    yield reg
    await reg.close()
    for model in reg.models.all_models():
        await model.stop()


async def test_reload_under_load_drops_nothing(registry: ModelControl) -> None:
    old = registry.models.get("tagger")
    stopped = asyncio.Event()
    real_stop = old.stop

    async def stop() -> None:
        assert old.in_flight == 0, "the old copy was stopped with requests in flight"
        await real_stop()
        stopped.set()

    old.stop = stop  # type: ignore[method-assign]
    in_flight = [asyncio.create_task(infer_tag(old)) for _ in range(12)]  # slow batches, queued and running
    await asyncio.sleep(0.05)
    assert old.in_flight == 12
    set_tag(registry.root / "tagger", "b", delay=0.0)
    new = await registry.load("tagger")  # returns once the new copy serves
    assert registry.models.get("tagger") is new and new is not old
    assert await infer_tag(registry.models.get("tagger")) == "v1:b"
    assert not stopped.is_set()  # the old copy still finishes its requests
    assert await asyncio.gather(*in_flight) == ["v1:a"] * 12
    await asyncio.wait_for(stopped.wait(), 5)
    # a caller that looked the model up before the swap and calls only now is served by the new copy
    assert await infer_tag(old) == "v1:b"


@pytest.mark.parametrize("registry", [0.0], indirect=True, ids=["batches-at-once"])  # nothing in flight here
async def test_failed_reload_keeps_the_old_copy_serving(registry: ModelControl) -> None:
    old = registry.models.get("tagger")
    (registry.root / "tagger" / "config.yaml").write_text("backend: python\nmax_batch_size: -3\n")
    with pytest.raises(InvalidRequestError, match=r"(?s)failed to load 'tagger'.*max_batch_size"):
        await registry.load("tagger")
    assert registry.models.get("tagger") is old
    assert await infer_tag(old) == "v1:a"
    [row] = [r for r in registry.states.index() if r["name"] == "tagger"]
    assert row["state"] == "READY" and row["version"] == "1"
    assert row["reason"].startswith("reload failed, serving the previous copy:") and "max_batch_size" in row["reason"]
    # weights/code that fail to load: same
    set_tag(registry.root / "tagger", "c")
    (registry.root / "tagger" / "1" / "model.py").write_text("raise RuntimeError('broken weights')\n")
    with pytest.raises(InvalidRequestError, match="RuntimeError: broken weights"):
        await registry.load("tagger")
    assert registry.models.get("tagger") is old and await infer_tag(old) == "v1:a"
    # fixed: the next load works and clears the reason
    write_tagger(registry.root, "tagger", tag="d", code_version="v2")
    await registry.load("tagger")
    assert await infer_tag(registry.models.get("tagger")) == "v2:d"
    assert [r["reason"] for r in registry.states.index() if r["name"] == "tagger"] == [""]


async def test_unload_drains_in_flight_requests(registry: ModelControl) -> None:
    old = registry.models.get("tagger")
    running = [asyncio.create_task(infer_tag(old)) for _ in range(3)]
    await asyncio.sleep(0.05)
    unloading = asyncio.create_task(registry.unload("tagger"))
    await asyncio.sleep(0.05)
    with pytest.raises(ModelNotFoundError):
        registry.models.get("tagger")  # out of service at once
    assert [r["state"] for r in registry.states.index() if r["name"] == "tagger"] == ["UNLOADING"]
    with pytest.raises(ServiceUnavailableError, match="unloading"):
        await infer_tag(old)  # a late caller holding the old copy: 503, not a hang
    assert not unloading.done()
    assert await asyncio.gather(*running) == ["v1:a"] * 3
    await asyncio.wait_for(unloading, 5)
    assert [r["state"] for r in registry.states.index() if r["name"] == "tagger"] == ["UNAVAILABLE"]


async def test_drain_timeout_stops_a_stuck_copy(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_tagger(repo, "tagger", delay=1.0)
    registry = ModelControl(repo, control_mode="explicit", load_models=["tagger"], drain_timeout_s=0.2)
    registry.prepare()
    [model] = registry.load_all()
    await model.start()
    try:
        running = asyncio.create_task(infer_tag(model))  # its batch runs for 1 s
        await asyncio.sleep(0.1)
        queued = asyncio.create_task(infer_tag(model))  # waits for the busy instance
        await asyncio.sleep(0.05)
        unloading = asyncio.create_task(registry.unload("tagger"))
        with pytest.raises(ServiceUnavailableError, match="unloading"):
            await asyncio.wait_for(queued, 0.7)  # failed once the 0.2 s drain timeout passed, not after 1 s
        assert not running.done()
        assert await running == "v1:a"  # a batch already in the backend cannot be interrupted: it completes
        await asyncio.wait_for(unloading, 5)
    finally:
        await registry.close()


class FakeLLM(LLMScheduler):
    """Streams `tokens` outputs, one per `gap` seconds; with a `gate`, not before the test opens it."""

    def __init__(self, label: str, tokens: int = 3, gap: float = 0.05, gate: asyncio.Event | None = None) -> None:
        self.label, self.tokens, self.gap, self.gate = label, tokens, gap, gate
        self.stopped = False
        self.fake_engine = object()

    @property
    def info(self):
        raise NotImplementedError

    @property
    def tokenizer(self):
        raise NotImplementedError

    @property
    def engine(self):
        return self.fake_engine

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        assert not self.stopped, "generate on a stopped scheduler"
        if self.gate is not None:
            await self.gate.wait()
        for i in range(self.tokens):
            await asyncio.sleep(self.gap)
            yield GenerationOutput(request_id=self.label, new_token_ids=[i], text="", finished=i == self.tokens - 1)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(running=1)


async def collect(scheduler: LLMScheduler) -> list[str]:
    request = GenerationRequest(request_id="r", prompt_token_ids=[1], sampling=SamplingParams())
    return [out.request_id async for out in scheduler.generate(request)]


async def test_llm_copies_hand_over_the_same_way() -> None:
    finish_old = asyncio.Event()  # the old copy's stream runs until the handover has been checked
    old_inner, new_inner = FakeLLM("old", gap=0.01, gate=finish_old), FakeLLM("new", gap=0.01)
    old = LoadedLLM(name="m", config=None, scheduler=ServingScheduler(old_inner, "m"))  # type: ignore[arg-type]
    new = LoadedLLM(name="m", config=None, scheduler=ServingScheduler(new_inner, "m"))  # type: ignore[arg-type]
    assert old.engine is old_inner.fake_engine and old.scheduler.stats().running == 1  # the inner's
    running = asyncio.create_task(collect(old.scheduler))
    await asyncio.sleep(0.02)
    assert old.in_flight == 1
    registry = ModelControl(Path("."), drain_timeout_s=5)
    retiring = asyncio.create_task(registry.retiring.drain_and_stop(old, new))
    await asyncio.sleep(0.01)
    assert await collect(old.scheduler) == ["new"] * 3  # a late caller is forwarded to the successor
    assert not old_inner.stopped
    finish_old.set()
    assert await running == ["old"] * 3  # the running stream finished on the old copy
    await asyncio.wait_for(retiring, 2)
    assert old_inner.stopped and not new_inner.stopped


async def test_llm_stream_closed_early_is_not_counted() -> None:
    wrapped = ServingScheduler(FakeLLM("x", tokens=100), "m")
    stream = wrapped.generate(GenerationRequest(request_id="r", prompt_token_ids=[1], sampling=SamplingParams()))
    await anext(stream)
    assert wrapped.in_flight.count == 1
    await stream.aclose()
    assert wrapped.in_flight.count == 0
