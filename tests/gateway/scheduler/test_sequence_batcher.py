"""Scheduler tests in the style of vLLM's: a step engine without a model, steps driven and inspected."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from engines.interface import StepEngine, Tokenizer
from engines.types import EngineInfo, GenerationRequest, SamplingParams, SequenceStep, StepResult
from gateway.scheduler.sequence_batcher import BatcherLimits, SequenceBatcher

EOS = 0


class CharTokenizer(Tokenizer):
    """Token id i <-> chr(ord('a') + i - 1); 0 is EOS."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) - ord("a") + 1 for c in text]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + t - 1) for t in token_ids if t != EOS)

    def convert_ids_to_tokens(self, token_ids: Sequence[int]) -> list[str]:
        return [self.decode([t]) for t in token_ids]

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, **kw):  # type: ignore[no-untyped-def]
        return self.encode("".join(m["content"] for m in messages))

    @property
    def vocab_size(self) -> int:
        return 27

    @property
    def all_special_ids(self) -> list[int]:
        return [EOS]


class CountingEngine(StepEngine):
    """Next token = (last token % 26) + 1; records every step and checks the block tables it is given."""

    def __init__(self, num_blocks: int = 64, block_size: int = 4) -> None:
        self._info = EngineInfo("fake", "float32", 256, 27, [EOS], block_size, num_blocks, 1)
        self.steps: list[list[SequenceStep]] = []
        self.released: list[str] = []
        self.gate: asyncio.Event | None = None

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def tokenizer(self) -> Tokenizer:
        return CharTokenizer()

    def execute(self, batch: Sequence[SequenceStep]) -> StepResult:
        self.steps.append(list(batch))
        tokens = {}
        for s in batch:
            needed = -(-(s.start_pos + len(s.token_ids)) // self._info.block_size)
            assert len(s.block_table) >= needed, "block table too short for the tokens written"
            if s.sample:
                tokens[s.seq_id] = s.token_ids[-1] % 26 + 1
        return StepResult(tokens)

    def release(self, seq_id: str) -> None:
        self.released.append(seq_id)


def req(rid: str, prompt: str, max_tokens: int = 4, priority: int = 0, **kw: object) -> GenerationRequest:
    return GenerationRequest(rid, CharTokenizer().encode(prompt), SamplingParams(temperature=0, max_tokens=max_tokens, **kw), priority)


async def drain(batcher: SequenceBatcher, r: GenerationRequest) -> tuple[str, str | None, int]:
    text, reason, n = "", None, 0
    async for out in batcher.generate(r):
        text += out.text
        reason = out.finish_reason
        n = out.completion_tokens
    return text, reason, n


@pytest.fixture
async def setup():
    engine = CountingEngine()
    batcher = SequenceBatcher(engine, BatcherLimits(max_num_seqs=4, max_num_batched_tokens=8))
    await batcher.start()
    yield engine, batcher
    await batcher.stop()


async def test_generates_and_frees_blocks(setup) -> None:
    engine, batcher = setup
    assert await drain(batcher, req("a", "abc", max_tokens=3)) == ("def", "length", 3)
    assert batcher.stats().kv_blocks_used == 0
    assert engine.released == ["a"]


async def test_chunked_prefill_respects_token_budget(setup) -> None:
    engine, batcher = setup
    text, _, _ = await drain(batcher, req("a", "abcdefghijklmnopqrst", max_tokens=2))  # 20 prompt tokens, budget 8
    assert text == "uv"
    prefill = [s[0] for s in engine.steps[:3]]
    assert [len(s.token_ids) for s in prefill] == [8, 8, 4]
    assert [s.start_pos for s in prefill] == [0, 8, 16]
    assert [s.sample for s in prefill] == [False, False, True]
    assert all(sum(len(s.token_ids) for s in step) <= 8 for step in engine.steps)


async def test_new_requests_join_running_batch(setup) -> None:
    engine, batcher = setup
    first = asyncio.create_task(drain(batcher, req("a", "a", max_tokens=12)))
    while len(engine.steps) < 3:
        await asyncio.sleep(0)
    second = asyncio.create_task(drain(batcher, req("b", "m", max_tokens=3)))
    assert (await second)[0] == "nop"
    assert (await first)[0] == "bcdefghijklm"
    mixed = [step for step in engine.steps if {s.seq_id for s in step} == {"a", "b"}]
    assert mixed, "b never shared a step with a"
    assert engine.steps[-1][0].seq_id == "a"  # b left when done, a kept going


async def test_stop_string_and_eos(setup) -> None:
    _, batcher = setup
    assert await drain(batcher, req("a", "a", max_tokens=10, stop=["de"])) == ("bc", "stop", 4)
    # "y" -> "z" -> "a"... never EOS with this engine; use stop_token_ids instead
    assert await drain(batcher, req("b", "a", max_tokens=10, stop_token_ids=[3])) == ("b", "stop", 2)


async def test_abort_frees_blocks_at_next_step(setup) -> None:
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
    assert "a" in engine.released


async def test_preemption_when_pool_runs_out() -> None:
    engine = CountingEngine(num_blocks=6, block_size=4)  # 24 slots for 3 sequences of up to 12 tokens
    batcher = SequenceBatcher(engine, BatcherLimits(max_num_seqs=4, max_num_batched_tokens=64))
    await batcher.start()
    try:
        results = await asyncio.gather(*(drain(batcher, req(f"r{i}", "abcd", max_tokens=8)) for i in range(3)))
    finally:
        await batcher.stop()
    assert all(r == ("efghijkl", "length", 8) for r in results)
    assert batcher.stats().preemptions > 0
    assert batcher.stats().kv_blocks_used == 0


async def test_priority_orders_admission() -> None:
    engine = CountingEngine()
    batcher = SequenceBatcher(engine, BatcherLimits(max_num_seqs=1, max_num_batched_tokens=64))
    await batcher.start()
    try:
        low = asyncio.create_task(drain(batcher, req("low", "a", max_tokens=2, priority=5)))
        high = asyncio.create_task(drain(batcher, req("high", "a", max_tokens=2, priority=-5)))
        await asyncio.gather(low, high)
    finally:
        await batcher.stop()
    first_ids = [step[0].seq_id for step in engine.steps]
    assert first_ids.index("high") < first_ids.index("low")


async def test_engine_failure_fails_only_that_step() -> None:
    class Flaky(CountingEngine):
        def execute(self, batch):  # type: ignore[no-untyped-def]
            if len(self.steps) == 1:
                self.steps.append(list(batch))
                raise RuntimeError("boom")
            return super().execute(batch)

    engine = Flaky()
    batcher = SequenceBatcher(engine, BatcherLimits())
    await batcher.start()
    try:
        _, reason, _ = await drain(batcher, req("a", "abc", max_tokens=5))
        assert reason == "error"
        assert await drain(batcher, req("b", "abc", max_tokens=2)) == ("de", "length", 2)
        assert batcher.stats().kv_blocks_used == 0
    finally:
        await batcher.stop()
