"""Scheduler tests in the style of vLLM's: a step engine without a model, steps driven and inspected."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from engines.interface import StepEngine, Tokenizer
from engines.types import EngineInfo, GenerationRequest, SamplingParams, SequenceStep, StepResult
from gateway.scheduler.sequence_batcher import BatcherLimits, SequenceBatcher
from tests.char_tokenizer import EOS, CharTokenizer


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


async def test_without_chunked_prefill_prompts_are_prefilled_whole() -> None:
    """enable_chunked_prefill=False: a prompt is never split. The first prompt a step admits may take the step past
    the budget (here a 20-token prompt, budget 8, beside a running decode); a second one waits for the next step."""
    engine = CountingEngine()
    batcher = SequenceBatcher(engine, BatcherLimits(max_num_seqs=4, max_num_batched_tokens=8,
                                                    enable_chunked_prefill=False))
    await batcher.start()
    try:
        running = asyncio.create_task(drain(batcher, req("a", "a", max_tokens=10)))
        while len(engine.steps) < 2:
            await asyncio.sleep(0)
        long, short = (asyncio.create_task(drain(batcher, req(rid, text, max_tokens=2)))
                       for rid, text in (("b", "abcdefghijklmnopqrst"), ("c", "xyz")))
        assert (await long)[0] == "uv" and (await short)[0] == "ab" and (await running)[0] == "bcdefghijk"
    finally:
        await batcher.stop()
    prefills = [s for step in engine.steps for s in step if len(s.token_ids) > 1]
    assert [(s.seq_id, s.start_pos, len(s.token_ids)) for s in prefills] == [("b", 0, 20), ("c", 0, 3)]
    step_of = {s.seq_id: i for i, step in enumerate(engine.steps) for s in step if len(s.token_ids) > 1}
    assert step_of["c"] > step_of["b"]  # not in the same step: b took the budget
    assert any({s.seq_id for s in step} >= {"a", "b"} for step in engine.steps)  # b joined the running decode


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


def _prefill_tokens(engine: CountingEngine, seq_id: str) -> int:
    return sum(len(s.token_ids) for step in engine.steps for s in step if s.seq_id == seq_id and s.num_output_tokens == 0)


async def test_prefix_cache_reuses_full_blocks(setup) -> None:
    engine, batcher = setup
    prompt = "abcdefghijklmnopq"  # 17 tokens: 4 full blocks of 4
    assert (await drain(batcher, req("a", prompt, max_tokens=2)))[0] == "rs"
    assert (await drain(batcher, req("b", prompt, max_tokens=2)))[0] == "rs"
    assert _prefill_tokens(engine, "a") == 17
    assert _prefill_tokens(engine, "b") == 1  # 16 cached tokens, only the last one is computed
    stats = batcher.stats()
    assert stats.prefix_cache_hit_tokens == 16 and stats.prefix_cache_queried_tokens == 34
    # a different prefix shares nothing
    await drain(batcher, req("c", "x" + prompt[1:], max_tokens=1))
    assert _prefill_tokens(engine, "c") == 17


async def test_full_prompt_hit_still_recomputes_last_token(setup) -> None:
    engine, batcher = setup
    await drain(batcher, req("a", "abcdefgh", max_tokens=1))
    await drain(batcher, req("b", "abcdefgh", max_tokens=1))
    assert _prefill_tokens(engine, "b") == 4  # (8 - 1) // 4 = 1 block reused; the rest is computed


async def test_session_keeps_conversation_warm_and_can_be_deleted() -> None:
    engine = CountingEngine(num_blocks=16, block_size=4)
    batcher = SequenceBatcher(engine, BatcherLimits(max_num_batched_tokens=64, session_max_tokens=32))
    await batcher.start()
    try:
        turn1 = req("t1", "abcdefghij", max_tokens=6)
        turn1.session_id = "s1"
        text, _, _ = await drain(batcher, turn1)
        assert batcher.stats().sessions == 1
        # 10 prompt + 6 output tokens, the last one not yet in the cache: 15 computed = 3 full blocks
        assert batcher.stats().session_pinned_blocks == 3
        # filler traffic that would otherwise evict the unreferenced blocks
        for i in range(6):
            await drain(batcher, req(f"f{i}", "zyxwvutsrqponm"[i:] + "ab", max_tokens=4))
        turn2 = req("t2", "abcdefghij" + text + "kk", max_tokens=1)
        turn2.session_id = "s1"
        await drain(batcher, turn2)
        assert _prefill_tokens(engine, "t2") == len("abcdefghij" + text + "kk") - 12
        assert batcher.delete_session("s1") is True
        assert batcher.delete_session("s1") is False
        assert batcher.stats().session_pinned_blocks == 0
    finally:
        await batcher.stop()


async def test_sessions_expire_and_respect_memory_cap() -> None:
    engine = CountingEngine(num_blocks=16, block_size=4)
    batcher = SequenceBatcher(engine, BatcherLimits(max_num_batched_tokens=64, session_max_tokens=12, session_ttl_seconds=0.2))
    await batcher.start()
    try:
        for sid in ("s1", "s2"):
            r = req(sid, "abcdefghijkl", max_tokens=1)
            r.session_id = sid
            await drain(batcher, r)
        stats = batcher.stats()
        assert stats.sessions == 1 and stats.session_pinned_blocks == 3  # cap of 12 tokens = 3 blocks: s1 evicted
        await asyncio.sleep(1.5)  # idle loop expires sessions about once a second
        assert batcher.stats().sessions == 0
    finally:
        await batcher.stop()


async def test_pinned_sessions_yield_when_pool_is_needed() -> None:
    engine = CountingEngine(num_blocks=4, block_size=4)
    batcher = SequenceBatcher(engine, BatcherLimits(max_num_batched_tokens=64, session_max_tokens=16))
    await batcher.start()
    try:
        r = req("a", "abcdefghijklm", max_tokens=1)
        r.session_id = "s"
        await drain(batcher, r)
        assert batcher.stats().session_pinned_blocks == 3
        # needs all 4 blocks with different content: the session must give way, not deadlock
        assert (await asyncio.wait_for(drain(batcher, req("b", "mlkjihgfedcb", max_tokens=4)), 5))[1] == "length"
    finally:
        await batcher.stop()


async def test_starving_request_is_admitted_ahead_of_higher_priority() -> None:
    engine = CountingEngine()
    batcher = SequenceBatcher(engine, BatcherLimits(max_num_seqs=1, max_num_batched_tokens=64))
    # loop not started (a pending future stands in for it): queue both, age the low one, schedule by hand
    batcher._task = asyncio.get_running_loop().create_future()
    low = batcher._add(req("low", "a", priority=9))
    batcher._add(req("high", "a", priority=-9))
    low.request.arrival_time -= 3600  # low has waited an hour, high just arrived
    batcher._limits.aging_seconds = 1800
    scheduled = batcher._schedule()
    assert [s.seq_id for s, _ in scheduled] == ["low"]


async def test_siblings_with_the_same_prompt_share_its_prefill(setup) -> None:
    engine, batcher = setup
    prompt = "abcdefghijklmnopq"  # 4 full blocks + 1 token
    results = await asyncio.gather(*(drain(batcher, req(f"n{i}", prompt, max_tokens=2)) for i in range(3)))
    assert all(r[0] == "rs" for r in results)
    prefill = sorted(_prefill_tokens(engine, f"n{i}") for i in range(3))
    assert prefill == [1, 1, 17]  # computed once, then reused by the two siblings


async def test_requests_sharing_a_prefill_are_admitted_together_once_it_is_committed() -> None:
    """16 chats with one 100-token system prompt arrive together: one prefill of the prompt (chunked over two
    steps), then every follower in the step after the commit (not one per step)."""
    engine = CountingEngine(num_blocks=256, block_size=4)
    batcher = SequenceBatcher(engine, BatcherLimits(max_num_seqs=32, max_num_batched_tokens=64))
    await batcher.start()
    system = ("abcdefghijklmnopqrstuvwxyz" * 4)[:100]
    tails = [chr(ord("a") + i) + chr(ord("z") - i) + "q" for i in range(16)]
    try:
        results = await asyncio.gather(*(drain(batcher, req(f"r{i}", system + t, max_tokens=2))
                                         for i, t in enumerate(tails)))
    finally:
        await batcher.stop()
    assert all(r[1] == "length" for r in results)
    leader = next(s.seq_id for s in engine.steps[0])
    committed = next(i for i, step in enumerate(engine.steps)
                     for s in step if s.seq_id == leader and s.start_pos + len(s.token_ids) >= len(system))
    first_token = {s.seq_id: i for i, step in reversed(list(enumerate(engine.steps))) for s in step if s.sample}
    assert len(first_token) == 16
    late = {rid: step for rid, step in first_token.items() if step > committed + 2}
    assert not late, f"prefix committed at step {committed}; first tokens later than 2 steps after: {late}"
    assert sum(_prefill_tokens(engine, f"r{i}") for i in range(16)) == 103 + 15 * 3  # the prompt once, then tails


async def test_a_row_that_fails_ends_alone_and_the_others_go_on() -> None:
    """One row's sampling fails in the engine (an entry in StepResult.errors) and another row's grammar raises on
    the event loop: each of them ends with its own error; the rest of the step produce what they produce alone."""

    class OneBadRow(CountingEngine):
        def execute(self, batch):  # type: ignore[no-untyped-def]
            result = super().execute(batch)
            if "bad-sampling" in result.token_ids:
                del result.token_ids["bad-sampling"]
                result.errors["bad-sampling"] = "the model produced non-finite logits (NaN or infinity) for this request"
            return result

    class Exploding:
        def allowed_mask(self, vocab_size: int) -> None:
            return None

        def accept(self, token_id: int) -> None:
            raise RuntimeError("matcher state corrupted")

    engine = OneBadRow()
    batcher = SequenceBatcher(engine, BatcherLimits(max_num_seqs=16, max_num_batched_tokens=64))
    await batcher.start()
    try:
        alone = {f"ok{i}": await drain(batcher, req(f"solo{i}", "abcdefg"[i:], max_tokens=5)) for i in range(6)}
        grammar = req("bad-grammar", "abc", max_tokens=5)
        grammar.sampling.constraint = Exploding()  # type: ignore[assignment]
        outs = await asyncio.gather(*(collect(batcher, r) for r in [
            *(req(f"ok{i}", "abcdefg"[i:], max_tokens=5) for i in range(6)), req("bad-sampling", "abc", max_tokens=5),
            grammar]))
    finally:
        await batcher.stop()
    together = {out[-1].request_id: out for out in outs}
    assert any({s.seq_id for s in step} >= set(together) for step in engine.steps), "the eight never shared a step"
    for rid, solo in alone.items():
        o = together[rid]
        assert ("".join(x.text for x in o), o[-1].finish_reason, o[-1].completion_tokens) == solo
    assert together["bad-sampling"][-1].finish_reason == "error"
    assert "non-finite logits" in together["bad-sampling"][-1].error
    assert together["bad-grammar"][-1].finish_reason == "error"
    assert "RuntimeError" in together["bad-grammar"][-1].error
    assert batcher.stats().kv_blocks_used == 0


async def collect(batcher: SequenceBatcher, r: GenerationRequest) -> list:
    return [out async for out in batcher.generate(r)]
