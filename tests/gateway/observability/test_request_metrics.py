"""The per-request LLM recorder: scripted update streams on a fake clock, then both real schedulers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from engines.types import GenerationOutput, GenerationRequest, SamplingParams
from gateway.errors import InternalError, RateLimitError
from gateway.observability import request_metrics
from gateway.observability.request_metrics import Histogram, LLMRequestStats
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.admission import AdmissionScheduler
from gateway.scheduler.llm.continuous_batcher import ContinuousBatcher
from tests.gateway.scheduler.llm.test_admission import ScriptedEngine, drain, until
from tests.gateway.scheduler.llm.test_step_scheduler import CountingEngine, tiny_budget
from tests.gateway.scheduler.llm.test_step_scheduler import req as char_request


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(request_metrics, "clock", fake)
    return fake


def request(rid: str = "r", prompt: int = 5) -> GenerationRequest:
    return GenerationRequest(rid, list(range(prompt)), SamplingParams(max_tokens=16))


def out(rid: str, tokens: int, total: int, reason: str | None = None, prompt: int = 5) -> GenerationOutput:
    return GenerationOutput(
        rid,
        [7] * tokens,
        "x" * tokens,
        finished=reason is not None,
        finish_reason=reason,
        prompt_tokens=prompt,
        completion_tokens=total,
    )


async def script(
    steps: list[tuple[float, GenerationOutput | BaseException]], clock: FakeClock
) -> AsyncIterator[GenerationOutput]:
    """Yields each update after advancing the clock by its delay; an exception is raised instead."""
    for delay, item in steps:
        clock.now += delay
        if isinstance(item, BaseException):
            raise item
        yield item


def test_histogram_buckets_are_inclusive_and_cumulative() -> None:
    h = Histogram((0.1, 1.0))
    h.observe(0.1)
    h.observe(0.5, times=2)
    h.observe(3.0)
    buckets, total = h.cumulative()
    assert buckets == [(0.1, 1), (1.0, 3), (float("inf"), 4)]
    assert total == pytest.approx(4.1) and h.count == 4


def test_buckets_are_vllms() -> None:
    assert request_metrics.TTFT_BUCKETS[:3] == (0.001, 0.005, 0.01) and request_metrics.TTFT_BUCKETS[-1] == 2560.0
    assert request_metrics.INTER_TOKEN_BUCKETS[0] == 0.01 and request_metrics.INTER_TOKEN_BUCKETS[-1] == 80.0
    assert request_metrics.REQUEST_LATENCY_BUCKETS[0] == 0.3 and request_metrics.REQUEST_LATENCY_BUCKETS[-1] == 7680.0


async def test_a_finished_request_records_latencies_tokens_and_triton_counters(clock: FakeClock) -> None:
    stats = LLMRequestStats()
    r = request()
    steps = [(0.5, out("r", 1, 1)), (0.1, out("r", 1, 2)), (0.2, out("r", 2, 4)), (0.0, out("r", 0, 4, "length"))]
    assert len([u async for u in stats.observe(r, script(steps, clock))]) == 4
    assert stats.ttft.count == 1 and stats.ttft.sum == pytest.approx(0.5)
    # 3 tokens after the first: one 0.1 s gap, then two tokens in 0.2 s (0.1 s each)
    assert stats.inter_token.count == 3 and stats.inter_token.sum == pytest.approx(0.3)
    assert stats.prompt_tokens == 5 and stats.generation_tokens == 4
    assert stats.finished == {"length": 1}
    assert stats.e2e.count == 1 and stats.e2e.sum == pytest.approx(0.8)
    assert stats.queue_time.count == 1 and stats.queue_time.sum == pytest.approx(0.5)  # not marked: first update
    m = stats.model_stats
    assert (m.success.count, m.fail.count, m.inference_count, m.execution_count) == (1, 0, 1, 1)
    assert m.success.ns == pytest.approx(0.8e9, rel=1e-6)
    assert stats._timings == {}  # nothing left behind


async def test_queue_time_ends_when_the_scheduler_admits(clock: FakeClock) -> None:
    stats = LLMRequestStats()
    r = request()

    async def updates() -> AsyncIterator[GenerationOutput]:
        clock.now += 2.0
        stats.scheduled("r")
        clock.now += 1.0
        stats.scheduled("r")  # a re-admission after preemption does not move it
        yield out("r", 1, 1, "stop")

    assert [u.finish_reason async for u in stats.observe(r, updates())] == ["stop"]
    assert stats.queue_time.sum == pytest.approx(2.0)
    assert stats.model_stats.queue.ns == pytest.approx(2e9, rel=1e-6)
    assert stats.model_stats.compute_infer.ns == pytest.approx(1e9, rel=1e-6)


@pytest.mark.parametrize(
    ("error", "reason"),
    [(RateLimitError("queue full"), "REJECTED"), (ValueError("bad"), "OTHER"), (InternalError("boom"), "BACKEND")],
)
async def test_a_request_refused_before_its_first_token_is_a_triton_failure_only(
    clock: FakeClock, error: Exception, reason: str
) -> None:
    stats = LLMRequestStats()
    with pytest.raises(type(error)):
        async for _ in stats.observe(request(), script([(0.1, error)], clock)):
            pass
    assert stats.model_stats.fail_reasons == {reason: 1} and stats.model_stats.success.count == 0
    assert stats.finished == {} and stats.ttft.count == 0 and stats.e2e.count == 0


@pytest.mark.parametrize(("finish", "reason"), [("error", "BACKEND"), ("abort", "OTHER")])
async def test_an_engine_side_failure_finishes_with_its_reason(clock: FakeClock, finish: str, reason: str) -> None:
    stats = LLMRequestStats()
    steps = [(0.1, out("r", 1, 1)), (0.1, out("r", 0, 1, finish))]
    assert [u.finish_reason async for u in stats.observe(request(), script(steps, clock))] == [None, finish]
    assert stats.model_stats.fail_reasons == {reason: 1} and stats.model_stats.success.count == 0
    assert stats.finished == {finish: 1} and stats.generation_tokens == 1 and stats.ttft.count == 1


async def test_a_client_that_goes_away_is_canceled_and_the_engine_stream_is_closed(clock: FakeClock) -> None:
    stats = LLMRequestStats()
    closed = []

    async def updates() -> AsyncIterator[GenerationOutput]:
        try:
            for i in range(1, 10):
                clock.now += 0.1
                yield out("r", 1, i)
        finally:
            closed.append(True)

    stream = stats.observe(request(), updates())
    await anext(stream)
    await anext(stream)
    await stream.aclose()
    assert closed == [True]
    assert stats.model_stats.fail_reasons == {"CANCELED": 1}
    assert stats.finished == {"abort": 1} and stats.generation_tokens == 2 and stats.e2e.count == 1


async def test_a_stream_that_ends_without_finishing_is_a_failure(clock: FakeClock) -> None:
    stats = LLMRequestStats()
    assert len([u async for u in stats.observe(request(), script([(0.1, out("r", 1, 1))], clock))]) == 1
    assert stats.model_stats.fail_reasons == {"OTHER": 1} and stats.finished == {"error": 1}


async def test_updates_without_token_ids_count_by_completion_tokens(clock: FakeClock) -> None:
    """Remote upstreams without logprobs send text only; completion_tokens carries the count."""
    stats = LLMRequestStats()
    steps = [
        (0.1, GenerationOutput("r", [], "ab", completion_tokens=2, prompt_tokens=5)),
        (0.1, GenerationOutput("r", [], "", True, "stop", prompt_tokens=5, completion_tokens=3)),
    ]
    assert len([u async for u in stats.observe(request(), script(steps, clock))]) == 2
    assert stats.generation_tokens == 3 and stats.ttft.count == 1 and stats.inter_token.count == 1


async def test_continuous_batcher_records_every_request() -> None:
    batcher = ContinuousBatcher(CountingEngine(), tiny_budget(max_num_seqs=4, max_num_batched_tokens=8))
    await batcher.start()
    try:
        for i, prompt in enumerate(["abc", "hello", "xy"]):
            outs = [o async for o in batcher.generate(char_request(f"s{i}", prompt, max_tokens=3))]
            assert outs[-1].completion_tokens == 3
        r = batcher.stats().requests
        assert r.finished == {"length": 3} and r.ttft.count == 3
        assert r.prompt_tokens == len("abc") + len("hello") + len("xy")
        assert r.generation_tokens == 9 and r.inter_token.count == 6  # one per token after each first token
        assert r.queue_time.count == 3 and r.model_stats.success.count == 3 and r.model_stats.inference_count == 3
        assert r._timings == {}
    finally:
        await batcher.stop()


async def test_admission_scheduler_records_rejections_and_successes() -> None:
    engine = ScriptedEngine(tokens=3)
    engine.gate = asyncio.Event()
    scheduler = AdmissionScheduler(engine, SchedulerConfig(max_num_seqs=1, max_queue_size=1))
    await scheduler.start()
    try:
        first = asyncio.create_task(drain(scheduler, request("a", prompt=1)))
        queued = asyncio.create_task(drain(scheduler, request("b", prompt=1)))
        await until(lambda: scheduler.stats().waiting == 1)
        with pytest.raises(RateLimitError):
            await drain(scheduler, request("c", prompt=1))
        engine.gate.set()
        assert len(await first) == len(await queued) == 3
        r = scheduler.stats().requests
        assert r.finished == {"length": 2} and r.generation_tokens == 6 and r.prompt_tokens == 2
        assert r.model_stats.success.count == 2 and r.queue_time.count == 2 and r.ttft.count == 2
        assert r.model_stats.fail_reasons == {"REJECTED": 1}
        engine.behaviour["d"] = "crash"
        assert (await drain(scheduler, request("d", prompt=1)))[-1].finish_reason == "error"
        assert r.model_stats.fail_reasons == {"REJECTED": 1, "BACKEND": 1} and r.finished == {"length": 2, "error": 1}
    finally:
        await scheduler.stop()
