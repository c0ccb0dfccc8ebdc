"""The async driver of continuous batching: streams, wake-ups, the worker thread, engine failures, stop.

The policy itself (what each step holds) is tested without an event loop in test_step_scheduler.py.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from engines.types import GenerationRequest
from gateway.errors import OverloadedError, ServiceUnavailableError
from gateway.repository.model_config import KVCacheConfig, SchedulerConfig
from gateway.scheduler.llm.continuous_batcher import ContinuousBatcher
from tests.gateway.scheduler.llm.test_step_scheduler import CountingEngine, req, tiny_budget


async def drain(batcher: ContinuousBatcher, r: GenerationRequest) -> tuple[str, str | None, int]:
    text, reason, n = "", None, 0
    async for out in batcher.generate(r):
        text += out.text
        reason = out.finish_reason
        n = out.completion_tokens
    return text, reason, n


@pytest.fixture
async def setup():
    engine = CountingEngine()
    batcher = ContinuousBatcher(engine, tiny_budget(max_num_seqs=4, max_num_batched_tokens=8))
    await batcher.start()
    yield engine, batcher
    await batcher.stop()


async def test_generates_and_releases_the_engine_state(setup) -> None:
    engine, batcher = setup
    assert await drain(batcher, req("a", "abc", max_tokens=3)) == ("def", "length", 3)
    assert batcher.stats().kv_blocks_used == 0
    assert engine.released == ["a"]


async def test_new_requests_join_the_running_batch(setup) -> None:
    engine, batcher = setup
    first = asyncio.create_task(drain(batcher, req("a", "a", max_tokens=12)))
    while len(engine.steps) < 3:
        await asyncio.sleep(0)
    second = asyncio.create_task(drain(batcher, req("b", "m", max_tokens=3)))  # wakes the running loop
    assert (await second)[0] == "nop"
    assert (await first)[0] == "bcdefghijklm"
    assert any({s.seq_id for s in step} == {"a", "b"} for step in engine.steps), "b never shared a step with a"
    assert engine.released == ["b", "a"]


async def test_closing_the_stream_aborts_the_sequence(setup) -> None:
    engine, batcher = setup
    gen = batcher.generate(req("a", "abcdefgh", max_tokens=100))
    await gen.__anext__()
    await gen.aclose()
    for _ in range(100):
        if batcher.stats().running == 0:
            break
        await asyncio.sleep(0.01)
    stats = batcher.stats()
    assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)
    assert engine.released == ["a"]
    assert await drain(batcher, req("a", "abc", max_tokens=1)) == ("d", "length", 1)  # the id is free again


async def test_engine_failure_fails_only_that_step() -> None:
    class Flaky(CountingEngine):
        def execute(self, batch):  # type: ignore[no-untyped-def]
            if len(self.steps) == 1:
                self.steps.append(list(batch))
                raise RuntimeError("boom")
            return super().execute(batch)

    engine = Flaky()
    batcher = ContinuousBatcher(engine)
    await batcher.start()
    try:
        _, reason, _ = await drain(batcher, req("a", "abc", max_tokens=5))
        assert reason == "error"
        assert await drain(batcher, req("b", "abc", max_tokens=2)) == ("de", "length", 2)
        assert batcher.stats().kv_blocks_used == 0 and batcher.healthy
    finally:
        await batcher.stop()


async def test_idle_loop_expires_sessions() -> None:
    engine = CountingEngine(num_blocks=16, block_size=4)
    batcher = ContinuousBatcher(
        engine, SchedulerConfig(max_num_batched_tokens=64), KVCacheConfig(session_ttl_seconds=0.2)
    )
    await batcher.start()
    try:
        r = req("s1", "abcdefghijkl", max_tokens=1)
        r.session_id = "s1"
        await drain(batcher, r)
        assert batcher.stats().sessions == 1
        async with asyncio.timeout(10):  # the idle loop wakes about once a second
            while batcher.stats().sessions:
                await asyncio.sleep(0.05)
    finally:
        await batcher.stop()


async def test_stop_ends_in_flight_streams_and_refuses_new_ones() -> None:
    engine = CountingEngine()
    batcher = ContinuousBatcher(engine, SchedulerConfig(max_num_seqs=1))
    with pytest.raises(ServiceUnavailableError):
        await drain(batcher, req("early", "abc"))
    await batcher.start()
    streams = [batcher.generate(req(rid, "abc", max_tokens=1000)) for rid in ("a", "b")]
    await streams[0].__anext__()
    waiting = asyncio.create_task(streams[1].__anext__())  # b waits behind a (max_num_seqs=1)
    await asyncio.sleep(0)
    await batcher.stop()
    ends = [out async for out in streams[0]][-1], await waiting
    assert [(o.request_id, o.finish_reason, o.error) for o in ends] == [
        ("a", "abort", "the model was unloaded"),
        ("b", "abort", "the model was unloaded"),
    ]
    assert not batcher.healthy and sorted(engine.released) == ["a", "b"]
    with pytest.raises(ServiceUnavailableError):
        await drain(batcher, req("late", "abc"))


class SlowEngine(CountingEngine):
    """5 ms a step, so a long request outlasts another's queue timeout."""

    def execute(self, batch):  # type: ignore[no-untyped-def]
        time.sleep(0.005)
        return super().execute(batch)


async def test_a_request_timed_out_in_the_queue_is_refused_with_429_and_the_stream_in_progress_goes_on() -> None:
    engine = SlowEngine()
    batcher = ContinuousBatcher(engine, tiny_budget(max_num_seqs=1, max_num_batched_tokens=8))
    await batcher.start()
    try:
        running = batcher.generate(req("a", "a", max_tokens=60))  # 0.3 s at least: six times b's queue timeout
        first = await anext(running)
        late = req("b", "b", max_tokens=3)
        late.queue_timeout = 0.05
        with pytest.raises(OverloadedError) as refused:
            await drain(batcher, late)
        assert refused.value.status == 429 and refused.value.reason == "queue_timeout"
        assert refused.value.headers["Retry-After"].isdigit()
        rest = [out async for out in running]
        assert len(first.text + "".join(o.text for o in rest)) == 60 and rest[-1].finish_reason == "length"
        assert batcher.stats().rejected == {"queue_timeout": 1}
    finally:
        await batcher.stop()
