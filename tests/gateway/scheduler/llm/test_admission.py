"""The admission scheduler over an engine that batches internally: a scripted engine, admission inspected."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from engines.interface import AsyncGenerateEngine, EngineUnavailableError, RequestRefusedError, Tokenizer
from engines.types import EngineInfo, GenerationOutput, GenerationRequest, SamplingParams
from gateway.errors import InvalidRequestError, RateLimitError, ServiceUnavailableError
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.admission import AdmissionScheduler


class NullTokenizer(Tokenizer):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1] * len(text)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "x" * len(token_ids)

    def convert_ids_to_tokens(self, token_ids: Sequence[int]) -> list[str]:
        return ["x"] * len(token_ids)

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, **kw):  # type: ignore[no-untyped-def]
        return [1]

    @property
    def vocab_size(self) -> int:
        return 2

    @property
    def all_special_ids(self) -> list[int]:
        return []


class ScriptedEngine(AsyncGenerateEngine):
    """Streams `tokens` updates per request; `gate` (if set) holds every request before its first update.

    `behaviour[request_id]` scripts failures: "value_error", "refused" (naming a field), "unavailable" (raised
    before the first update), "crash" (raised after one update), "truncate" (the stream ends without a finished
    update).
    """

    def __init__(self, tokens: int = 3) -> None:
        self.tokens = tokens
        self.gate: asyncio.Event | None = None
        self.started: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.aborted: list[str] = []
        self.closed: list[str] = []
        self.behaviour: dict[str, str] = {}
        self.is_healthy = True
        self.shut_down = False
        self.sessions_deleted: list[str] = []

    @property
    def info(self) -> EngineInfo:
        return EngineInfo("fake", "float32", 128, 2, [0])

    @property
    def tokenizer(self) -> Tokenizer:
        return NullTokenizer()

    @property
    def healthy(self) -> bool:
        return self.is_healthy

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        rid = request.request_id
        self.started.append(rid)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            how = self.behaviour.get(rid)
            if how == "value_error":
                raise ValueError("prompt too long for this engine")
            if how == "refused":
                raise RequestRefusedError("the grammar is invalid", "response_format")
            if how == "unavailable":
                raise EngineUnavailableError("engine is down")
            for i in range(self.tokens):
                await asyncio.sleep(0)
                if how == "crash" and i == 1:
                    raise RuntimeError("kernel exploded")
                if how == "truncate" and i == self.tokens - 1:
                    return
                last = i == self.tokens - 1
                yield GenerationOutput(
                    rid,
                    [1],
                    "x",
                    finished=last,
                    finish_reason="length" if last else None,
                    prompt_tokens=1,
                    completion_tokens=i + 1,
                )
        finally:
            self.in_flight -= 1
            self.closed.append(rid)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def shutdown(self) -> None:
        self.shut_down = True

    def delete_session(self, session_id: str) -> bool:
        self.sessions_deleted.append(session_id)
        return True


def req(rid: str, priority: int = 0) -> GenerationRequest:
    return GenerationRequest(rid, [1], SamplingParams(max_tokens=3), priority=priority)


async def drain(scheduler: AdmissionScheduler, request: GenerationRequest) -> list[GenerationOutput]:
    return [out async for out in scheduler.generate(request)]


async def started(
    limits: SchedulerConfig, engine: ScriptedEngine | None = None
) -> tuple[AdmissionScheduler, ScriptedEngine]:
    engine = engine or ScriptedEngine()
    scheduler = AdmissionScheduler(engine, limits)
    await scheduler.start()
    return scheduler, engine


async def until(predicate, timeout: float = 2.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


async def test_caps_requests_inside_the_engine() -> None:
    scheduler, engine = await started(SchedulerConfig(max_num_seqs=2))
    results = await asyncio.gather(*(drain(scheduler, req(f"r{i}")) for i in range(6)))
    assert engine.max_in_flight == 2
    assert all(r[-1].finished and r[-1].completion_tokens == 3 for r in results)
    assert scheduler.stats().running == 0 and scheduler.stats().waiting == 0


async def test_waiting_requests_enter_by_priority_then_arrival() -> None:
    scheduler, engine = await started(SchedulerConfig(max_num_seqs=1))
    engine.gate = asyncio.Event()
    holder = asyncio.create_task(drain(scheduler, req("holder")))
    await until(lambda: engine.started == ["holder"])
    tasks = [
        asyncio.create_task(drain(scheduler, req(rid, prio)))
        for rid, prio in (("low", 5), ("high", -1), ("mid", 0), ("mid2", 0))
    ]
    await until(lambda: scheduler.stats().waiting == 4)
    engine.gate.set()
    await asyncio.gather(holder, *tasks)
    assert engine.started == ["holder", "high", "mid", "mid2", "low"]


async def test_aging_lets_a_starved_request_jump_the_priorities() -> None:
    scheduler, engine = await started(SchedulerConfig(max_num_seqs=1, aging_seconds=0.05))
    engine.gate = asyncio.Event()
    holder = asyncio.create_task(drain(scheduler, req("holder")))
    await until(lambda: engine.started == ["holder"])
    old = asyncio.create_task(drain(scheduler, req("old", priority=9)))
    await until(lambda: scheduler.stats().waiting == 1)
    await asyncio.sleep(0.1)
    new = asyncio.create_task(drain(scheduler, req("new", priority=0)))
    await until(lambda: scheduler.stats().waiting == 2)
    engine.gate.set()
    await asyncio.gather(holder, old, new)
    assert engine.started == ["holder", "old", "new"]


async def test_full_queue_is_429_with_retry_after() -> None:
    scheduler, engine = await started(SchedulerConfig(max_num_seqs=1, max_queue_size=1))
    engine.gate = asyncio.Event()
    holder = asyncio.create_task(drain(scheduler, req("holder")))
    queued = asyncio.create_task(drain(scheduler, req("queued")))
    await until(lambda: scheduler.stats().waiting == 1)
    with pytest.raises(RateLimitError) as err:
        await drain(scheduler, req("rejected"))
    assert err.value.status == 429 and err.value.headers["Retry-After"]
    engine.gate.set()
    await asyncio.gather(holder, queued)
    assert "rejected" not in engine.started


async def test_closing_the_stream_aborts_the_engine_request_and_frees_its_slot() -> None:
    scheduler, engine = await started(SchedulerConfig(max_num_seqs=1), ScriptedEngine(tokens=50))
    stream = scheduler.generate(req("gone"))
    first = await anext(stream)
    assert not first.finished
    await stream.aclose()  # the client disconnected
    assert engine.aborted == ["gone"] and "gone" in engine.closed
    assert scheduler.stats().running == 0
    out = await drain(scheduler, req("next"))  # the slot was handed back
    assert out[-1].finished and "next" not in engine.aborted


async def test_a_request_cancelled_while_waiting_leaves_no_trace() -> None:
    scheduler, engine = await started(SchedulerConfig(max_num_seqs=1))
    engine.gate = asyncio.Event()
    holder = asyncio.create_task(drain(scheduler, req("holder")))
    await until(lambda: engine.started == ["holder"])
    waiter = asyncio.create_task(drain(scheduler, req("impatient")))
    await until(lambda: scheduler.stats().waiting == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert scheduler.stats().waiting == 0
    engine.gate.set()
    await holder
    assert (await drain(scheduler, req("after")))[-1].finished
    assert "impatient" not in engine.started


async def test_engine_errors_become_gateway_errors() -> None:
    scheduler, engine = await started(SchedulerConfig())
    engine.behaviour = {
        "bad": "value_error",
        "field": "refused",
        "down": "unavailable",
        "crash": "crash",
        "cut": "truncate",
    }
    with pytest.raises(InvalidRequestError, match="prompt too long") as bad:
        await drain(scheduler, req("bad"))
    assert bad.value.param is None
    with pytest.raises(InvalidRequestError, match="grammar is invalid") as refused:
        await drain(scheduler, req("field"))
    assert refused.value.param == "response_format"
    with pytest.raises(ServiceUnavailableError) as err:
        await drain(scheduler, req("down"))
    assert err.value.status == 503 and err.value.headers["Retry-After"]
    crashed = await drain(scheduler, req("crash"))
    assert [o.finished for o in crashed] == [False, True]
    assert crashed[-1].finish_reason == "error" and "server log" in (crashed[-1].error or "")
    cut = await drain(scheduler, req("cut"))
    assert cut[-1].finished and cut[-1].finish_reason == "error"
    assert scheduler.stats().running == 0


async def test_an_unhealthy_engine_makes_the_model_unready_and_refuses_with_503() -> None:
    scheduler, engine = await started(SchedulerConfig())
    assert scheduler.healthy
    engine.is_healthy = False
    assert not scheduler.healthy
    with pytest.raises(ServiceUnavailableError):
        await drain(scheduler, req("r"))
    assert engine.started == []


async def test_stop_fails_waiting_requests_and_shuts_the_engine_down() -> None:
    scheduler, engine = await started(SchedulerConfig(max_num_seqs=1))
    engine.gate = asyncio.Event()
    holder = scheduler.generate(req("holder"))
    holder_task = asyncio.create_task(anext(holder))
    await until(lambda: engine.started == ["holder"])
    waiter = asyncio.create_task(drain(scheduler, req("waiter")))
    await until(lambda: scheduler.stats().waiting == 1)
    await scheduler.stop()
    with pytest.raises(ServiceUnavailableError):
        await waiter
    assert engine.shut_down and engine.aborted == ["holder"]
    assert not scheduler.healthy
    holder_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder_task
    with pytest.raises(ServiceUnavailableError):
        await drain(scheduler, req("late"))


async def test_sessions_are_the_engines_business() -> None:
    scheduler, engine = await started(SchedulerConfig())
    assert scheduler.delete_session("s1")
    assert engine.sessions_deleted == ["s1"]


async def test_a_request_waiting_past_its_timeout_is_rejected_and_the_running_one_finishes() -> None:
    scheduler, engine = await started(SchedulerConfig(max_num_seqs=1))
    engine.gate = asyncio.Event()
    holder = asyncio.create_task(drain(scheduler, req("holder")))
    await until(lambda: engine.started == ["holder"])
    late = req("late")
    late.queue_timeout = 0.05
    with pytest.raises(RateLimitError) as err:
        await drain(scheduler, late)
    assert err.value.status == 429 and err.value.headers["Retry-After"].isdigit()
    assert "timeout" in err.value.message
    assert scheduler.stats().waiting == 0 and scheduler.stats().rejected == {"queue_timeout": 1}
    engine.gate.set()
    assert (await holder)[-1].finish_reason == "length"  # the running request was never touched
    assert "late" not in engine.started


async def test_delay_keeps_a_late_request_behind_the_others() -> None:
    scheduler, engine = await started(SchedulerConfig(max_num_seqs=1, timeout_action="DELAY"))
    engine.gate = asyncio.Event()
    holder = asyncio.create_task(drain(scheduler, req("holder")))
    await until(lambda: engine.started == ["holder"])
    late = req("late")
    late.queue_timeout = 0.02
    delayed = asyncio.create_task(drain(scheduler, late))
    await asyncio.sleep(0.1)  # past its timeout: moved behind every other request, still waiting
    on_time = asyncio.create_task(drain(scheduler, req("on-time", priority=5)))
    await until(lambda: scheduler.stats().waiting == 2)
    engine.gate.set()
    await asyncio.gather(holder, delayed, on_time)
    assert engine.started == ["holder", "on-time", "late"]
    assert scheduler.stats().rejected == {}
