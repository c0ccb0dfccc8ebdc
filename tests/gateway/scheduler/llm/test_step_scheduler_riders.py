"""Followers of a shared prefix admitted in the step that completes it (`EngineInfo.prefill_reads_step_writes`).

The fake engine keeps the token of every cache slot, as test_speculation.py's, and computes a step in the native
engine's order (model_runner.py `_attend`): the decode rows write their keys and values and attend, then every
prefill row writes before any prefill row attends. Every position a row reads must then hold its sequence's token:
a follower that read a block its leader writes in the same step from a decode row, or a block nobody writes, fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from engines.pytorch.step_layout import is_decode
from engines.types import SequenceStep, StepResult
from tests.gateway.scheduler.llm.test_speculation import VerifyingEngine
from tests.gateway.scheduler.llm.test_step_scheduler import _prefill_tokens, req, run, scheduler, step, summary

SYSTEM = ("abcdefghijklmnopqrstuvwxyz" * 4)[:100]  # 25 blocks of 4
TAILS = {"f1": 20, "f2": 5, "f3": 30, "f4": 10, "f5": 25, "f6": 15}


class StepOrderEngine(VerifyingEngine):
    """VerifyingEngine's checks, in the order a native engine's step reads and writes its cache."""

    def __init__(self, num_blocks: int = 256, block_size: int = 4) -> None:
        super().__init__(num_blocks=num_blocks, block_size=block_size)
        self._info = replace(self._info, prefill_reads_step_writes=True)

    def execute(self, batch: Sequence[SequenceStep]) -> StepResult:
        self.steps.append(list(batch))
        assert not any(s.num_draft_tokens for s in batch), "no proposals in these tests"
        for rows in ([s for s in batch if is_decode(s)], [s for s in batch if not is_decode(s)]):
            for s in rows:
                assert len(s.block_table) == -(-(s.start_pos + len(s.token_ids)) // self._info.block_size)
                for j, token in enumerate(s.token_ids):
                    self.slots[self._slot(s, s.start_pos + j)] = token
            for s in rows:
                for pos in range(s.start_pos):
                    assert self.slots.get(self._slot(s, pos)) == s.history[pos], f"{s.seq_id}: wrong KV at {pos}"
        return StepResult({s.seq_id: self.rule(s.history) for s in batch if s.sample})


def _chats() -> list:
    leader = req("leader", SYSTEM + "zzz", max_tokens=3)
    return [
        leader,
        *(req(rid, SYSTEM + chr(ord("a") + k) * n, max_tokens=3) for k, (rid, n) in enumerate(TAILS.items())),
    ]


def _alone(r) -> tuple:
    engine = StepOrderEngine()
    return summary(run(scheduler(engine, max_num_seqs=32, max_num_batched_tokens=64), engine, r)[r.request_id])


def _layout(engine: StepOrderEngine) -> list[list[tuple[str, int, int]]]:
    return [[(s.seq_id, s.start_pos, len(s.token_ids)) for s in step] for step in engine.steps]


def test_followers_tails_ride_in_the_leaders_last_chunk() -> None:
    """The leader's prompt takes two chunks (budget 64); the followers wait through the first (their prefix is not
    complete after it) and ride in the second: its blocks 16..24 complete the shared 100 tokens, and the followers'
    tails (shortest first, whole) fill the step's leftover 25 tokens. The rest come from the cache in the next step.
    Nothing of the prefix is computed twice, and every answer is the one the request gets alone."""
    engine = StepOrderEngine()
    sched = scheduler(engine, max_num_seqs=32, max_num_batched_tokens=64)
    outs = run(sched, engine, *_chats())
    layout = _layout(engine)
    assert layout[:4] == [
        [("leader", 0, 64)],
        [("leader", 64, 39), ("f2", 100, 5), ("f4", 100, 10)],  # 54 of 64: the 15 would not fit whole
        [("leader", 103, 1), ("f2", 105, 1), ("f4", 110, 1), ("f6", 100, 15), ("f1", 100, 20), ("f5", 100, 25)],
        [("leader", 104, 1), ("f1", 120, 1), ("f2", 106, 1), ("f4", 111, 1), ("f5", 125, 1), ("f6", 115, 1)]
        + [("f3", 100, 30)],  # decodes in arrival order, then the last follower whole
    ], layout
    leader_table = engine.steps[1][0].block_table
    assert all(s.block_table[:25] == leader_table[:25] for s in engine.steps[1][1:])  # the leader's own blocks
    assert sum(_prefill_tokens(engine, r.request_id) for r in _chats()) == 103 + sum(TAILS.values())
    for r in _chats():
        assert summary(outs[r.request_id]) == _alone(r), r.request_id
    assert [o.cached_prompt_tokens for o in outs["f2"]][-1] == 100
    stats = sched.stats()
    assert stats.kv_blocks_used == 0 and stats.running == 0


def test_followers_ride_in_the_step_that_admits_the_leader_whole() -> None:
    """A budget that holds the whole prompt: the leader and every follower in one step (vLLM V1 finds the blocks of
    a request scheduled earlier in the same step likewise); the prefix is computed once. The followers are known as
    such only once the leader is admitted, so they come in queue order here."""
    engine = StepOrderEngine()
    outs = run(scheduler(engine, max_num_seqs=32, max_num_batched_tokens=256), engine, *_chats())
    assert _layout(engine)[0] == [("leader", 0, 103)] + [(rid, 100, n) for rid, n in TAILS.items()]
    assert sum(_prefill_tokens(engine, r.request_id) for r in _chats()) == 103 + sum(TAILS.values())
    assert all(summary(outs[r.request_id]) == _alone(r) for r in _chats())


def test_a_one_token_remainder_does_not_ride() -> None:
    """A follower whose prompt is the shared blocks and one token would be a decode row, which attends before the
    step's prefill rows write: it waits for the next step and reads the prefix from the cache."""
    engine = StepOrderEngine()
    outs = run(
        scheduler(engine, max_num_seqs=32, max_num_batched_tokens=256),
        engine,
        req("leader", SYSTEM + "zzz", max_tokens=2),
        req("one", SYSTEM + "q", max_tokens=2),
        req("two", SYSTEM + "qr", max_tokens=2),
    )
    assert _layout(engine)[:2] == [
        [("leader", 0, 103), ("two", 100, 2)],
        [("leader", 103, 1), ("two", 102, 1), ("one", 100, 1)],
    ]
    assert summary(outs["one"]) == _alone(req("one", SYSTEM + "q", max_tokens=2))


def test_riders_keep_their_blocks_when_the_leader_is_aborted_in_their_step() -> None:
    """The leader's client goes away while the step that completes the prefix is in flight: the step's writes
    stand, the followers hold references to the blocks they took and finish with the answers they get alone."""
    engine = StepOrderEngine(num_blocks=40)  # few blocks: freed ones are soon handed out again
    sched = scheduler(engine, max_num_seqs=32, max_num_batched_tokens=64)
    chats = _chats()[:3]  # the leader, f1 (20) and f2 (5)
    for r in chats:
        sched.add(r)
    step(sched, engine)  # the leader's first chunk
    plan = sched.schedule()
    assert [(s.seq_id, len(s.token_ids)) for s in plan.steps] == [("leader", 39), ("f2", 5), ("f1", 20)]
    sched.abort("leader")
    outs = sched.update(plan, engine.execute(plan.steps))
    by_id: dict[str, list] = {}
    for o in outs:
        by_id.setdefault(o.request_id, []).append(o)
    # another request takes the blocks the leader's abort frees, while the followers still read theirs
    for rid, later in run(sched, engine, req("other", "zyxwvutsrqponmlkjihgfedcbazyxwvutsrqponmlk", 2)).items():
        by_id.setdefault(rid, []).extend(later)
    assert summary(by_id["leader"])[1] == "abort"
    for r in chats[1:]:
        assert summary(by_id[r.request_id]) == _alone(r), r.request_id
    assert sched.stats().kv_blocks_used == 0
