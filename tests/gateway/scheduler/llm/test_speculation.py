"""Speculative decoding in the scheduler, driven by hand without a model (as test_step_scheduler.py): proposals,
acceptance, stopping exactly where one-token steps stop, KV rollback and the rules that switch proposals off.

The fake engine's "model" is a rule from context to next token that mostly counts (so n-gram proposals are often
right) and sometimes does not (so some are rejected). It records what it writes to each cache slot and checks, on
every step, that every position a step reads holds that sequence's token (a rejected token counted as computed, or
a block holding one registered in the prefix cache, fails it) and that a sequence holds no block past the step's
last token (blocks that held only rejected tokens were given back).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from engines.pytorch.step_layout import is_decode
from engines.types import EngineInfo, SamplingParams, SequenceStep, StepResult
from gateway.kv_cache.manager import KVCacheManager
from gateway.repository.engine_config import SpeculativeSection
from gateway.scheduler.llm.ngram_draft import NgramIndex
from tests.char_tokenizer import EOS
from tests.gateway.scheduler.llm.test_step_scheduler import CountingEngine, req, run, scheduler, step, summary

Rule = Callable[[Sequence[int]], int]


def counting_with_turns(context: Sequence[int]) -> int:
    """Counts a, b, c ... but after every 'g' comes 'x' when the context length is odd: some proposals fail."""
    last = context[-1]
    if last == 7 and len(context) % 2:
        return 24
    return last % 26 + 1


class VerifyingEngine(CountingEngine):
    """A fake step engine that verifies proposals with `rule` (greedy) and keeps the token of every cache slot."""

    def __init__(self, rule: Rule = counting_with_turns, num_blocks: int = 64, block_size: int = 4) -> None:
        super().__init__(num_blocks, block_size)
        self._info = EngineInfo("fake", "float32", 256, 27, [EOS], block_size, num_blocks, 1, exact_verification=True)
        self.rule = rule
        self.slots: dict[int, int] = {}

    def _slot(self, s: SequenceStep, pos: int) -> int:
        bs = self._info.block_size
        return s.block_table[pos // bs] * bs + pos % bs

    def execute(self, batch: Sequence[SequenceStep]) -> StepResult:
        self.steps.append(list(batch))
        result = StepResult({})
        for s in batch:
            context = s.history[: s.start_pos] if s.num_draft_tokens else s.history
            end = s.start_pos + len(s.token_ids)  # blocks past the step's last token were given back (rollback)
            assert len(s.block_table) == -(-end // self._info.block_size), f"{s.seq_id}: blocks kept past {end}"
            for pos in range(s.start_pos):  # what this step's attention reads must be this sequence's tokens
                assert self.slots.get(self._slot(s, pos)) == context[pos], f"{s.seq_id}: wrong KV at {pos}"
            for j, token in enumerate(s.token_ids):
                self.slots[self._slot(s, s.start_pos + j)] = token
            if not s.sample:
                continue
            drafts = s.draft_token_ids
            seen = list(s.history)
            for j in range(len(drafts) + 1):
                token = self.rule(seen)
                if j == len(drafts) or token != drafts[j]:
                    break
                seen.append(token)
            result.token_ids[s.seq_id] = token
            if drafts:
                result.num_accepted[s.seq_id] = j
        return result


SPEC = SpeculativeSection(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3, disable_by_batch_size=4)


def outputs(spec: SpeculativeSection | None, *requests, rule: Rule = counting_with_turns, **limits):
    engine = VerifyingEngine(rule)
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=32, speculative=spec, **limits)
    outs = run(sched, engine, *requests)
    return {rid: (summary(o), [t for x in o for t in x.new_token_ids]) for rid, o in outs.items()}, engine, sched


def requests():
    return [
        req("long", "abcdefghij" * 3, max_tokens=40),
        req("stop", "abcdefghijklmnopqrstuvwxyz", max_tokens=40, stop=["pqr"]),
        req("eos-id", "abcdefghijklmnop" * 2, max_tokens=40, stop_token_ids=[10]),
        req("max", "abcdefghijklmnopqrstuvwxyzabcde", max_tokens=7),
    ]


def test_output_is_the_same_with_and_without_speculation() -> None:
    plain, plain_engine, _ = outputs(None, *requests())
    spec, spec_engine, sched = outputs(SPEC, *requests())
    assert spec == plain
    stats = sched.stats()
    assert stats.spec_drafts > 0 and 0 < stats.spec_accepted_tokens < stats.spec_draft_tokens  # some of each
    assert len(spec_engine.steps) < 0.7 * len(plain_engine.steps)
    assert stats.kv_blocks_used == 0 and stats.running == 0


def test_stops_inside_accepted_tokens_exactly_where_one_token_steps_stop() -> None:
    """The stop string, the stop token and max_tokens fall inside runs of accepted proposals here."""
    for i, r in enumerate(requests()):
        plain = outputs(None, requests()[i])[0][r.request_id][0]
        engine = VerifyingEngine()
        sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=32, speculative=SPEC)
        outs = run(sched, engine, r)[r.request_id]
        assert summary(outs) == plain, r.request_id
        assert sum(len(o.new_token_ids) for o in outs) == outs[-1].completion_tokens
        assert any(s.num_draft_tokens for step in engine.steps for s in step), r.request_id


def test_eos_inside_accepted_tokens() -> None:
    def eos_after_m(context: Sequence[int]) -> int:  # counting, but EOS after the first 'm' of the output
        return EOS if context[-1] == 13 and len(context) > 26 else context[-1] % 26 + 1

    r = req("e", "abcdefghijklmnopqrstuvwxyz", max_tokens=40)
    plain = outputs(None, r, rule=eos_after_m)[0]["e"]
    spec, _, sched = outputs(SPEC, req("e", "abcdefghijklmnopqrstuvwxyz", max_tokens=40), rule=eos_after_m)
    assert spec["e"] == plain and plain[0][1] == "stop" and plain[1][-1] == EOS
    assert sched.stats().spec_accepted_tokens > 0


def test_rejected_tokens_are_rolled_back_and_never_cached() -> None:
    """Later requests reuse the cached blocks of earlier ones (prefix caching), whose steps had rejections: every
    position they read must hold their own token (the engine checks), and blocks past the accepted length go back
    to the pool after each verification."""
    engine = VerifyingEngine()
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=32, speculative=SPEC)
    first = run(sched, engine, req("a", "abcdefghij" * 3, max_tokens=40))["a"]
    tokens = req("a", "abcdefghij" * 3).prompt_token_ids + [t for o in first for t in o.new_token_ids]
    again = req("b", "", max_tokens=20)
    again.prompt_token_ids = tokens + [1, 2]
    run(sched, engine, again)
    assert sched.stats().prefix_cache_hit_tokens >= 64
    verifications = [s for step in engine.steps for s in step if s.num_draft_tokens]
    assert any(s for s in verifications)
    assert sched.stats().kv_blocks_used == 0


def test_blocks_that_held_only_rejected_tokens_are_given_back() -> None:
    """ "abcdeabc": the step after the prompt verifies [d | e a b c] (what followed "b c d" before), positions 8-12
    over four blocks of 4; counting accepts e and answers f. The next step computes f alone at position 10, in three
    blocks: the fourth, which held only rejected tokens, went back to the pool."""
    engine = VerifyingEngine(lambda context: context[-1] % 26 + 1)
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=32, speculative=SPEC)
    assert summary(run(sched, engine, req("a", "abcdeabc", max_tokens=8))["a"])[0] == "defghijk"
    verify, after = engine.steps[1][0], engine.steps[2][0]
    assert (verify.start_pos, verify.token_ids, len(verify.block_table)) == (8, [4, 5, 1, 2, 3], 4)
    assert (after.start_pos, after.token_ids, len(after.block_table)) == (10, [6], 3)


def test_blocks_past_the_accepted_length_are_freed() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    tokens = list(range(1, 10))
    kv.admit("s", tokens)
    kv.allocate("s", 9 + 5)  # the last token and four proposed: four blocks
    assert len(kv.block_table("s")) == 4 and kv.pool.num_used == 4
    kv.commit("s", tokens + [10], 10)  # the last token and one proposal accepted: 10 computed, 2 blocks full
    kv.truncate("s", 11)
    assert len(kv.block_table("s")) == 3 and kv.pool.num_used == 3
    kv.truncate("s", 1)  # never below the committed blocks
    assert len(kv.block_table("s")) == 2


def test_low_acceptance_pauses_proposals() -> None:
    def never_repeats(context: Sequence[int]) -> int:  # pseudo-random: proposals are almost always wrong
        return hash(tuple(context)) % 26 + 1

    _, engine, sched = outputs(SPEC, req("a", "abcabcabcabc", max_tokens=60), rule=never_repeats)
    drafted = sum(1 for step in engine.steps for s in step if s.num_draft_tokens)
    assert sched.stats().spec_accepted_tokens < sched.stats().spec_draft_tokens / 4
    assert 0 < drafted <= 12  # after a few failures the sequence is paused for longer and longer (16, 32 tokens)


def test_large_batches_and_unverifiable_requests_get_no_proposals() -> None:
    many = [req(f"r{i}", "abcdefghij" * 3, max_tokens=10) for i in range(4)]
    _, engine, _ = outputs(SpeculativeSection(disable_by_batch_size=3, prompt_lookup_min=1), *many)
    assert not any(s.num_draft_tokens for step in engine.steps for s in step if len(step) > 3)
    for kw in ({"logprobs": 1}, {"temperature": 1.0, "seed": 7}):
        r = req("x", "abcdefghij" * 3, max_tokens=10)
        r.sampling = SamplingParams(max_tokens=10, **kw)
        _, engine, _ = outputs(SPEC, r)
        assert not any(s.num_draft_tokens for step in engine.steps for s in step), kw


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        ([1, 2, 3, 4, 1, 2], [3, 4, 1, 2]),  # "1 2" occurred before: what followed it
        ([1, 2, 3, 1, 2, 9, 1, 2], [9, 1, 2]),  # the latest earlier occurrence wins; the proposal ends at the end
        ([5, 6, 7, 8], []),  # nothing repeats
        ([1, 2, 3, 9, 2, 3, 4, 1, 2, 3], [9, 2, 3, 4]),  # the longest n-gram first ("1 2 3", not "2 3")
    ],
)
def test_ngram_proposals(tokens: list[int], expected: list[int]) -> None:
    index = NgramIndex(1, 3)
    assert index.propose(tokens, 4) == expected
    grown = NgramIndex(1, 3)  # built token by token, as a sequence grows: the same answers
    for n in range(1, len(tokens) + 1):
        proposal = grown.propose(tokens[:n], 4)
    assert proposal == expected


def test_an_engine_without_exact_verification_gets_no_proposals() -> None:
    engine = VerifyingEngine()
    engine._info.exact_verification = False
    sched = scheduler(engine, speculative=SPEC)
    run(sched, engine, req("a", "abcdefghij" * 3, max_tokens=20))
    assert not any(s.num_draft_tokens for step in engine.steps for s in step)


def test_proposals_stay_within_the_engines_exact_decode_rows() -> None:
    """An engine whose verification matches one-token steps only up to a number of decode rows (the native engine
    on a CPU with AMX) never gets a step with more: the drafts shrink, the output is the same."""
    plain, _, _ = outputs(None, *requests())
    engine = VerifyingEngine()
    engine._info.max_exact_decode_rows = 7
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=32, speculative=SPEC)
    outs = run(sched, engine, *requests())
    assert {rid: (summary(o), [t for x in o for t in x.new_token_ids]) for rid, o in outs.items()} == plain
    decode_rows = [
        sum(len(s.token_ids) for s in step if s.num_draft_tokens or len(s.token_ids) == 1)
        for step in engine.steps
        if any(s.num_draft_tokens for s in step)
    ]
    assert decode_rows and max(decode_rows) <= 7
    assert sched.stats().spec_drafts > 0


def test_admitted_decode_rows_count_against_the_exact_decode_rows() -> None:
    """Admissions whose uncached remainder is one token (a prefix-cache hit on a 13-token prompt over blocks of 4)
    are decode rows too: with a limit of 7, a sequence that could verify 4 proposals beside six such admissions
    verifies fewer (or none), and every step that verifies stays within 7 decode rows."""
    engine = VerifyingEngine()
    engine._info.max_exact_decode_rows = 7
    sched = scheduler(engine, max_num_seqs=8, max_num_batched_tokens=32, speculative=SPEC)
    cached = "abcdefghijklm"
    run(sched, engine, req("warm", cached, max_tokens=1))
    sched.add(req("spec", "abcdefghijklmnopqrstuvwxyzabcde", max_tokens=40))
    outs = step(sched, engine)  # its prompt (12 tokens cached); "f" follows, then up to 4 proposals "ghij"
    for i in range(6):
        sched.add(req(f"hit{i}", cached, max_tokens=3))
    plan = sched.schedule()
    assert [len(s.token_ids) for s in plan.steps[1:]] == [1] * 6  # six admissions, one uncached token each
    assert plan.steps[0].seq_id == "spec" and len(plan.steps[0].token_ids) >= 1
    decode_rows = sum(len(s.token_ids) for s in plan.steps if is_decode(s))
    assert decode_rows <= 7, f"{decode_rows} decode rows in a step that verifies proposals"
    outs += sched.update(plan, engine.execute(plan.steps))
    for _ in range(200):
        if not sched.has_unfinished():
            break
        outs += step(sched, engine)
    verifying = [
        sum(len(s.token_ids) for s in st if is_decode(s)) for st in engine.steps if any(s.num_draft_tokens for s in st)
    ]
    assert verifying and max(verifying) <= 7
    assert sched.stats().kv_blocks_used == 0
    got = "".join(o.text for o in outs if o.request_id == "spec")
    plain_engine = VerifyingEngine()
    plain = run(
        scheduler(plain_engine, max_num_seqs=8, max_num_batched_tokens=32),
        plain_engine,
        req("spec", "abcdefghijklmnopqrstuvwxyzabcde", max_tokens=40),
    )["spec"]
    assert got == "".join(o.text for o in plain)
