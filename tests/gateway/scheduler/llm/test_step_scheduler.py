"""The continuous-batching policy driven by hand, as vLLM tests its `Scheduler`: no model, no thread, no event loop.

A step engine without a model stands in for the engine: `schedule()` plans a step, the fake computes it, `update()`
turns its result into outputs. The async driver is tested in test_continuous_batcher.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from engines.interface import StepEngine, Tokenizer
from engines.types import EngineInfo, GenerationOutput, GenerationRequest, SamplingParams, SequenceStep, StepResult
from gateway.errors import RateLimitError
from gateway.repository.engine_config import SpeculativeSection
from gateway.repository.model_config import KVCacheConfig, SchedulerConfig
from gateway.scheduler.llm import step_scheduler
from gateway.scheduler.llm.step_scheduler import StepScheduler
from tests.char_tokenizer import EOS, CharTokenizer


class CountingEngine(StepEngine):
    """Next token = (last token % 26) + 1; records every step and checks the block tables it is given."""

    def __init__(self, num_blocks: int = 64, block_size: int = 4) -> None:
        self._info = EngineInfo("fake", "float32", 256, 27, [EOS], block_size, num_blocks, 1)
        self.steps: list[list[SequenceStep]] = []
        self.released: list[str] = []

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
    return GenerationRequest(
        rid, CharTokenizer().encode(prompt), SamplingParams(temperature=0, max_tokens=max_tokens, **kw), priority
    )


def tiny_budget(**fields: object) -> SchedulerConfig:
    """A scheduler section whose token budget may be below the config's minimum of 16, so a few characters of
    prompt already need several chunks (the toy engines' tokens are characters)."""
    return SchedulerConfig.model_construct(**fields)  # type: ignore[arg-type]


def scheduler(engine: CountingEngine, speculative: SpeculativeSection | None = None, **limits: object) -> StepScheduler:
    """A policy over `engine` with the model config's sections; `limits`: fields of `scheduler` and `kv_cache`."""
    kv = {k: limits.pop(k) for k in list(limits) if k in KVCacheConfig.model_fields}
    return StepScheduler(engine.info, engine.tokenizer, tiny_budget(**limits), KVCacheConfig(**kv), speculative)  # type: ignore[arg-type]


def step(sched: StepScheduler, engine: CountingEngine) -> list[GenerationOutput]:
    """One iteration, as the driver runs it: plan, compute on the fake engine, apply (or idle as the plan says)."""
    plan = sched.schedule()
    outs = list(plan.finished)
    if plan.scheduled:
        outs += sched.update(plan, engine.execute(plan.steps))
    else:
        time.sleep(plan.idle_seconds)
    return outs


def run(
    sched: StepScheduler, engine: CountingEngine, *requests: GenerationRequest
) -> dict[str, list[GenerationOutput]]:
    """Add `requests` and step until nothing is left; each request's outputs in order."""
    for r in requests:
        sched.add(r)
    outs: dict[str, list[GenerationOutput]] = {}
    for _ in range(1000):
        if not sched.has_unfinished():
            return outs
        for out in step(sched, engine):
            outs.setdefault(out.request_id, []).append(out)
    raise AssertionError("the scheduler never finished its requests")


def summary(outs: list[GenerationOutput]) -> tuple[str, str | None, int]:
    assert [o.finished for o in outs].count(True) == 1 and outs[-1].finished, "exactly one finished output, last"
    return "".join(o.text for o in outs), outs[-1].finish_reason, outs[-1].completion_tokens


def drain(sched: StepScheduler, engine: CountingEngine, r: GenerationRequest) -> tuple[str, str | None, int]:
    return summary(run(sched, engine, r)[r.request_id])


@pytest.fixture
def setup() -> tuple[CountingEngine, StepScheduler]:
    engine = CountingEngine()
    return engine, scheduler(engine, max_num_seqs=4, max_num_batched_tokens=8)


def test_generates_and_frees_blocks(setup) -> None:
    engine, sched = setup
    assert drain(sched, engine, req("a", "abc", max_tokens=3)) == ("def", "length", 3)
    stats = sched.stats()
    assert (stats.running, stats.waiting, stats.kv_blocks_used, stats.steps) == (0, 0, 0, 3)


def test_chunked_prefill_respects_token_budget(setup) -> None:
    engine, sched = setup
    text, _, _ = drain(sched, engine, req("a", "abcdefghijklmnopqrst", max_tokens=2))  # 20 prompt tokens, budget 8
    assert text == "uv"
    prefill = [s[0] for s in engine.steps[:3]]
    assert [len(s.token_ids) for s in prefill] == [8, 8, 4]
    assert [s.start_pos for s in prefill] == [0, 8, 16]
    assert [s.sample for s in prefill] == [False, False, True]
    assert all(sum(len(s.token_ids) for s in step) <= 8 for step in engine.steps)


def test_without_chunked_prefill_prompts_are_prefilled_whole() -> None:
    """enable_chunked_prefill=False: a prompt is never split. The first prompt a step admits may take the step past
    the budget (here a 20-token prompt, budget 8, beside a running decode); a second one waits for the next step."""
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=8, enable_chunked_prefill=False)
    sched.add(req("a", "a", max_tokens=10))
    first = step(sched, engine) + step(sched, engine)
    outs = run(sched, engine, req("b", "abcdefghijklmnopqrst", max_tokens=2), req("c", "xyz", max_tokens=2))
    outs["a"] = first + outs["a"]
    assert summary(outs["b"])[0] == "uv" and summary(outs["c"])[0] == "ab" and summary(outs["a"])[0] == "bcdefghijk"
    prefills = [s for step in engine.steps for s in step if len(s.token_ids) > 1]
    assert [(s.seq_id, s.start_pos, len(s.token_ids)) for s in prefills] == [("b", 0, 20), ("c", 0, 3)]
    step_of = {s.seq_id: i for i, step in enumerate(engine.steps) for s in step if len(s.token_ids) > 1}
    assert step_of["c"] == step_of["b"] + 1  # not in the same step: b took the budget
    assert {s.seq_id for s in engine.steps[step_of["b"]]} == {"a", "b"}  # b joined the running decode


def test_new_requests_join_running_batch(setup) -> None:
    engine, sched = setup
    sched.add(req("a", "a", max_tokens=12))
    first = [o for _ in range(3) for o in step(sched, engine)]
    outs = run(sched, engine, req("b", "m", max_tokens=3))
    assert summary(outs["b"])[0] == "nop"
    assert summary(first + outs["a"])[0] == "bcdefghijklm"
    assert [{s.seq_id for s in step} for step in engine.steps[3:6]] == [{"a", "b"}] * 3  # b shared a's steps
    assert engine.steps[-1][0].seq_id == "a"  # b left when done, a kept going


def test_stop_string_and_eos(setup) -> None:
    engine, sched = setup
    assert drain(sched, engine, req("a", "a", max_tokens=10, stop=["de"])) == ("bc", "stop", 4)
    # "y" -> "z" -> "a"... never EOS with this engine; use stop_token_ids instead
    assert drain(sched, engine, req("b", "a", max_tokens=10, stop_token_ids=[3])) == ("b", "stop", 2)


def test_abort_frees_blocks_at_next_schedule(setup) -> None:
    engine, sched = setup
    sched.add(req("a", "abcdefgh", max_tokens=100))
    plan = sched.schedule()
    sched.abort("a")  # while the step is "in flight": its result is dropped
    assert sched.update(plan, engine.execute(plan.steps)) == []
    assert sched.stats().kv_blocks_used > 0
    [out] = step(sched, engine)
    assert (out.request_id, out.finished, out.finish_reason) == ("a", True, "abort")
    stats = sched.stats()
    assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)
    sched.abort("a")  # a finished id is ignored
    assert not sched.has_unfinished()


def test_queue_full_and_duplicate_ids_are_refused() -> None:
    engine = CountingEngine()
    sched = scheduler(engine, max_queue_size=1)
    sched.add(req("a", "abc"))
    step(sched, engine)  # a runs: the queue is empty again
    with pytest.raises(ValueError, match="duplicate"):
        sched.add(req("a", "abc"))
    sched.add(req("b", "abc"))
    with pytest.raises(RateLimitError):
        sched.add(req("c", "abc"))


def test_preemption_when_pool_runs_out() -> None:
    engine = CountingEngine(num_blocks=6, block_size=4)  # 24 slots for 3 sequences of up to 12 tokens
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=64)
    outs = run(sched, engine, *(req(f"r{i}", "abcd", max_tokens=8) for i in range(3)))
    assert all(summary(outs[f"r{i}"]) == ("efghijkl", "length", 8) for i in range(3))
    assert sched.stats().preemptions > 0
    assert sched.stats().kv_blocks_used == 0


def test_priority_orders_admission() -> None:
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=1, max_num_batched_tokens=64)
    run(sched, engine, req("low", "a", max_tokens=2, priority=5), req("high", "a", max_tokens=2, priority=-5))
    first_ids = [step[0].seq_id for step in engine.steps]
    assert first_ids.index("high") < first_ids.index("low")


def test_engine_failure_ends_only_that_step() -> None:
    engine = CountingEngine()
    sched = scheduler(engine)
    sched.add(req("a", "abc", max_tokens=5))
    plan = sched.schedule()
    [out] = sched.fail(plan, "the model failed")
    assert (out.request_id, out.finish_reason, out.error) == ("a", "error", "the model failed")
    assert drain(sched, engine, req("b", "abc", max_tokens=2)) == ("de", "length", 2)
    assert sched.stats().kv_blocks_used == 0


def test_finish_all_ends_every_request_once() -> None:
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=1)
    sched.add(req("a", "abc"))
    sched.add(req("b", "abc"))
    step(sched, engine)  # a runs, b waits
    outs = sched.finish_all("abort", error="the model was unloaded")
    assert [(o.request_id, o.finish_reason, o.error) for o in outs] == [
        ("a", "abort", "the model was unloaded"),
        ("b", "abort", "the model was unloaded"),
    ]
    assert not sched.has_unfinished() and sched.stats().kv_blocks_used == 0


def _prefill_tokens(engine: CountingEngine, seq_id: str) -> int:
    return sum(
        len(s.token_ids) for step in engine.steps for s in step if s.seq_id == seq_id and s.num_output_tokens == 0
    )


def test_prefix_cache_reuses_full_blocks(setup) -> None:
    engine, sched = setup
    prompt = "abcdefghijklmnopq"  # 17 tokens: 4 full blocks of 4
    assert drain(sched, engine, req("a", prompt, max_tokens=2))[0] == "rs"
    assert drain(sched, engine, req("b", prompt, max_tokens=2))[0] == "rs"
    assert _prefill_tokens(engine, "a") == 17
    assert _prefill_tokens(engine, "b") == 1  # 16 cached tokens, only the last one is computed
    stats = sched.stats()
    assert stats.prefix_cache_hit_tokens == 16 and stats.prefix_cache_queried_tokens == 34
    # a different prefix shares nothing
    drain(sched, engine, req("c", "x" + prompt[1:], max_tokens=1))
    assert _prefill_tokens(engine, "c") == 17


def test_full_prompt_hit_still_recomputes_last_token(setup) -> None:
    engine, sched = setup
    drain(sched, engine, req("a", "abcdefgh", max_tokens=1))
    drain(sched, engine, req("b", "abcdefgh", max_tokens=1))
    assert _prefill_tokens(engine, "b") == 4  # (8 - 1) // 4 = 1 block reused; the rest is computed


def test_session_keeps_conversation_warm_and_can_be_deleted() -> None:
    engine = CountingEngine(num_blocks=16, block_size=4)
    sched = scheduler(engine, max_num_batched_tokens=64, session_max_tokens=32)
    turn1 = req("t1", "abcdefghij", max_tokens=6)
    turn1.session_id = "s1"
    text, _, _ = drain(sched, engine, turn1)
    assert sched.stats().sessions == 1
    # 10 prompt + 6 output tokens, the last one not yet in the cache: 15 computed = 3 full blocks
    assert sched.stats().session_pinned_blocks == 3
    # filler traffic that would otherwise evict the unreferenced blocks
    for i in range(6):
        drain(sched, engine, req(f"f{i}", "zyxwvutsrqponm"[i:] + "ab", max_tokens=4))
    turn2 = req("t2", "abcdefghij" + text + "kk", max_tokens=1)
    turn2.session_id = "s1"
    drain(sched, engine, turn2)
    assert _prefill_tokens(engine, "t2") == len("abcdefghij" + text + "kk") - 12
    assert sched.delete_session("s1") is True
    assert sched.delete_session("s1") is False
    assert sched.stats().session_pinned_blocks == 0


def test_sessions_expire_and_respect_memory_cap() -> None:
    engine = CountingEngine(num_blocks=16, block_size=4)
    sched = scheduler(engine, max_num_batched_tokens=64, session_max_tokens=12, session_ttl_seconds=0.3)
    for sid in ("s1", "s2"):
        r = req(sid, "abcdefghijkl", max_tokens=1)
        r.session_id = sid
        drain(sched, engine, r)
    stats = sched.stats()
    assert stats.sessions == 1 and stats.session_pinned_blocks == 3  # cap of 12 tokens = 3 blocks: s1 evicted
    time.sleep(0.35)
    assert not sched.schedule().scheduled  # every schedule, idle or not, expires idle sessions
    assert sched.stats().sessions == 0


def test_pinned_sessions_yield_when_pool_is_needed() -> None:
    engine = CountingEngine(num_blocks=4, block_size=4)
    sched = scheduler(engine, max_num_batched_tokens=64, session_max_tokens=16)
    r = req("a", "abcdefghijklm", max_tokens=1)
    r.session_id = "s"
    drain(sched, engine, r)
    assert sched.stats().session_pinned_blocks == 3
    # needs all 4 blocks with different content: the session must give way, not deadlock (run() bounds the steps)
    assert drain(sched, engine, req("b", "mlkjihgfedcb", max_tokens=4))[1] == "length"


def test_a_waiting_request_of_higher_priority_goes_before_a_lower_ones_prompt_chunk() -> None:
    """A batch request (low priority) is prefilling its long prompt in chunks when a chat arrives: the chat's prompt
    takes the next step's budget and the batch request's next chunk waits; equal priorities keep arrival order."""
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=8)
    sched.add(req("batch", "abcdefghijklmnopqrst", max_tokens=2, priority=9))
    step(sched, engine)  # its first chunk of 8
    sched.add(req("chat", "abc", max_tokens=2))
    assert [s.seq_id for s in sched.schedule().steps] == ["chat"]
    outs = run(sched, engine)
    assert summary(outs["chat"])[1] == "length" and summary(outs["batch"])[1] == "length"

    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=8)
    sched.add(req("first", "abcdefghijklmnopqrst", max_tokens=2))
    step(sched, engine)
    sched.add(req("second", "abc", max_tokens=2))
    assert [s.seq_id for s in sched.schedule().steps] == ["first"]  # its chunk takes the whole budget


def test_a_held_back_chunk_goes_on_when_the_waiting_request_cannot_be_admitted() -> None:
    """The chat that waits cannot get KV blocks (the batch request holds the pool): the batch request's chunk is
    scheduled all the same, so the step is not wasted and nothing stalls."""
    engine = CountingEngine(num_blocks=3, block_size=4)
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=8, enable_prefix_caching=False)
    sched.add(req("batch", "abcdefghij", max_tokens=2, priority=9))  # 12 tokens in all: the whole pool
    step(sched, engine)  # its first chunk holds 2 of the 3 blocks
    sched.add(req("chat", "zyxwvuts", max_tokens=2))  # its first chunk needs 2 blocks
    assert [s.seq_id for s in sched.schedule().steps] == ["batch"]
    outs = run(sched, engine)
    assert summary(outs["chat"])[1] == "length" and summary(outs["batch"])[1] == "length"


def test_starving_request_is_admitted_ahead_of_higher_priority() -> None:
    engine = CountingEngine()
    sched = scheduler(
        engine, max_num_seqs=1, max_num_batched_tokens=64, aging_seconds=1800, default_timeout_seconds=0
    )  # waits an hour: no queue timeout
    low = req("low", "a", priority=9)
    sched.add(low)
    sched.add(req("high", "a", priority=-9))
    low.arrival_time -= 3600  # low has waited an hour, high just arrived
    assert [s.seq_id for s in sched.schedule().steps] == ["low"]


def test_siblings_with_the_same_prompt_share_its_prefill(setup) -> None:
    engine, sched = setup
    prompt = "abcdefghijklmnopq"  # 4 full blocks + 1 token
    outs = run(sched, engine, *(req(f"n{i}", prompt, max_tokens=2) for i in range(3)))
    assert all(summary(o)[0] == "rs" for o in outs.values())
    prefill = sorted(_prefill_tokens(engine, f"n{i}") for i in range(3))
    assert prefill == [1, 1, 17]  # computed once, then reused by the two siblings


def test_requests_sharing_a_prefill_are_admitted_together_once_it_is_committed() -> None:
    """16 chats with one 100-token system prompt arrive together: one prefill of the prompt (chunked over two
    steps), then every follower in the step after the commit (not one per step)."""
    engine = CountingEngine(num_blocks=256, block_size=4)
    sched = scheduler(engine, max_num_seqs=32, max_num_batched_tokens=64)
    system = ("abcdefghijklmnopqrstuvwxyz" * 4)[:100]
    tails = [chr(ord("a") + i) + chr(ord("z") - i) + "q" for i in range(16)]
    outs = run(sched, engine, *(req(f"r{i}", system + t, max_tokens=2) for i, t in enumerate(tails)))
    assert all(summary(o)[1] == "length" for o in outs.values())
    leader = next(s.seq_id for s in engine.steps[0])
    committed = next(
        i
        for i, step in enumerate(engine.steps)
        for s in step
        if s.seq_id == leader and s.start_pos + len(s.token_ids) >= len(system)
    )
    first_token = {s.seq_id: i for i, step in reversed(list(enumerate(engine.steps))) for s in step if s.sample}
    assert len(first_token) == 16
    late = {rid: step for rid, step in first_token.items() if step > committed + 2}
    assert not late, f"prefix committed at step {committed}; first tokens later than 2 steps after: {late}"
    assert sum(_prefill_tokens(engine, f"r{i}") for i in range(16)) == 103 + 15 * 3  # the prompt once, then tails


def test_followers_of_a_shared_prefix_are_admitted_shortest_first_and_whole() -> None:
    """A leader and six followers of one 100-token system prompt, sent together, the followers' own tails of 20, 5,
    30, 10, 25 and 15 tokens (105 in all; budget 64). The prefix is computed once (the leader's two chunks, followers
    held); in the step after its commit the followers come shortest first as far as the budget goes (5, 10, 15, 20:
    four first tokens), none split to fill the leftover budget; the 25 and 30 follow whole in the next step, beside
    the decodes. Admitting in arrival order instead would have split the 10 over two steps and given first tokens
    to only three followers in that step."""
    engine = CountingEngine(num_blocks=256, block_size=4)
    sched = scheduler(engine, max_num_seqs=32, max_num_batched_tokens=64)
    system = ("abcdefghijklmnopqrstuvwxyz" * 4)[:100]
    tails = {"f1": 20, "f2": 5, "f3": 30, "f4": 10, "f5": 25, "f6": 15}
    followers = [req(rid, system + chr(ord("a") + k) * n, max_tokens=2) for k, (rid, n) in enumerate(tails.items())]
    outs = run(sched, engine, req("leader", system + "zzz", max_tokens=2), *followers)
    assert all(summary(o)[1] == "length" for o in outs.values())
    layout = [[(s.seq_id, len(s.token_ids)) for s in step] for step in engine.steps]
    assert layout[:4] == [
        [("leader", 64)],  # the shared prefix's first chunk; every follower waits for it
        [("leader", 39)],  # its commit
        [("leader", 1), ("f2", 5), ("f4", 10), ("f6", 15), ("f1", 20)],  # 51 of 64: the 25 waits, whole
        [("f1", 1), ("f2", 1), ("f4", 1), ("f6", 1), ("f5", 25), ("f3", 30)],  # decodes first, then the rest
    ], layout
    assert sum(_prefill_tokens(engine, rid) for rid in ["leader", *tails]) == 103 + sum(tails.values())


def test_a_follower_longer_than_a_step_is_still_chunked() -> None:
    """The whole-remainder rule only holds back a follower whose remainder fits one step: a longer one starts in the
    leftover budget (it needs several steps anyway), and the first admission of a step is always made."""
    engine = CountingEngine(num_blocks=256, block_size=4)
    sched = scheduler(engine, max_num_seqs=32, max_num_batched_tokens=16)
    system = "abcdefghijklmnop"  # 4 blocks
    run(sched, engine, req("leader", system + "z", max_tokens=2), req("long", system + "b" * 40, max_tokens=2))
    layout = [[(s.seq_id, len(s.token_ids)) for s in step] for step in engine.steps]
    assert layout[:3] == [[("leader", 16)], [("leader", 1), ("long", 15)], [("leader", 1), ("long", 15)]], layout


def test_a_row_that_fails_ends_alone_and_the_others_go_on() -> None:
    """One row's sampling fails in the engine (an entry in StepResult.errors) and another row's grammar raises in
    `update`: each of them ends with its own error; the rest of the step produce what they produce alone."""

    class OneBadRow(CountingEngine):
        def execute(self, batch):  # type: ignore[no-untyped-def]
            result = super().execute(batch)
            if "bad-sampling" in result.token_ids:
                del result.token_ids["bad-sampling"]
                result.errors["bad-sampling"] = (
                    "the model produced non-finite logits (NaN or infinity) for this request"
                )
            return result

    class Exploding:
        def allowed_mask(self, vocab_size: int) -> None:
            return None

        def accept(self, token_id: int) -> None:
            raise RuntimeError("matcher state corrupted")

    engine = OneBadRow()
    sched = scheduler(engine, max_num_seqs=16, max_num_batched_tokens=64)
    alone = {f"ok{i}": drain(sched, engine, req(f"solo{i}", "abcdefg"[i:], max_tokens=5)) for i in range(6)}
    grammar = req("bad-grammar", "abc", max_tokens=5)
    grammar.sampling.constraint = Exploding()  # type: ignore[assignment]
    together = run(
        sched,
        engine,
        *(req(f"ok{i}", "abcdefg"[i:], max_tokens=5) for i in range(6)),
        req("bad-sampling", "abc", max_tokens=5),
        grammar,
    )
    assert any({s.seq_id for s in step} >= set(together) for step in engine.steps), "the eight never shared a step"
    for rid, solo in alone.items():
        assert summary(together[rid]) == solo
    assert summary(together["bad-sampling"])[1] == "error"
    assert "non-finite logits" in together["bad-sampling"][-1].error
    assert summary(together["bad-grammar"])[1] == "error"
    assert "RuntimeError" in together["bad-grammar"][-1].error
    assert sched.stats().kv_blocks_used == 0


def test_a_request_past_its_queue_timeout_is_rejected_and_the_running_one_goes_on() -> None:
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=1, max_num_batched_tokens=64)
    sched.add(req("a", "abc", max_tokens=6))
    step(sched, engine)  # a runs, alone (max_num_seqs=1)
    late = req("b", "abc")
    late.queue_timeout, late.arrival_time = 0.5, time.monotonic() - 1.0  # it has waited past its timeout
    sched.add(late)
    outs = step(sched, engine)
    rejected = [o for o in outs if o.request_id == "b"]
    assert [(o.finished, o.finish_reason) for o in rejected] == [(True, "rejected")]
    assert "timeout" in (rejected[0].error or "")
    assert sched.stats().rejected == {"queue_timeout": 1}
    rest = run(sched, engine)
    assert summary([o for o in outs if o.request_id == "a"] + rest["a"])[1:] == ("length", 6)


def test_a_preempted_sequence_is_never_timed_out_and_delay_keeps_the_late_one() -> None:
    engine = CountingEngine(num_blocks=6, block_size=4)  # 24 slots for 3 sequences of up to 12 tokens: preemptions
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=64, timeout_action="DELAY")
    requests = [req(f"r{i}", "abcd", max_tokens=8) for i in range(3)]
    for r in requests:
        r.queue_timeout, r.arrival_time = 0.001, time.monotonic()
    outs = run(sched, engine, *requests)
    assert sched.stats().preemptions > 0
    assert all(summary(outs[f"r{i}"]) == ("efghijkl", "length", 8) for i in range(3))  # none rejected
    assert sched.stats().rejected == {}


def test_an_arrival_that_cannot_start_in_time_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    now = 1000.0  # the scheduler's clock, moved by hand: 1.2 s of steps without waiting them out
    monkeypatch.setattr(step_scheduler, "time", SimpleNamespace(monotonic=lambda: now))
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=1, max_num_batched_tokens=64)
    for i in range(40):  # a backlog drained at one admission per step: the scheduler learns the rate
        sched.add(req(f"w{i}", "a", max_tokens=1))
    for _ in range(24):  # a step every 50 ms
        step(sched, engine)
        now += 0.05
    assert sched.stats().waiting > 10
    wait = sched.stats().expected_wait_seconds
    assert wait > 0.5
    hurried = req("hurried", "a")
    hurried.queue_timeout = wait / 4
    with pytest.raises(RateLimitError) as refused:
        sched.add(hurried)
    assert refused.value.headers["Retry-After"].isdigit()
    patient = req("patient", "a")
    patient.queue_timeout = wait * 4
    sched.add(patient)
    assert sched.stats().rejected == {"expected_wait": 1}
