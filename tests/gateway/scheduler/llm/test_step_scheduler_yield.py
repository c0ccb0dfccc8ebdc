"""Lower priorities yield to higher ones (step_scheduler.py's module docstring): a chat beside a Batch API batch.

Driven by hand as test_step_scheduler.py: "batch" sequences carry a low priority (a high number), "chat" ones the
default 0. The grace window is off (`priority_grace_seconds=0`) unless a test is about it.
"""

from __future__ import annotations

import time

from engines.pytorch.step_layout import is_decode
from tests.gateway.scheduler.llm.test_speculation import SPEC, VerifyingEngine
from tests.gateway.scheduler.llm.test_step_scheduler import CountingEngine, req, run, scheduler, step, summary

LOW = 1 << 30


def ids(plan_steps) -> list[str]:  # type: ignore[no-untyped-def]
    return [s.seq_id for s in plan_steps]


def test_lower_priority_decode_rows_and_admissions_sit_out_a_higher_ones_prefill() -> None:
    """Two batch sequences decode; a chat arrives with another batch request: the step that prefills the chat
    carries neither the batch decode rows nor the new batch request, and the next step carries them all again."""
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=8, max_num_batched_tokens=16, priority_grace_seconds=0)
    sched.add(req("batch1", "abc", max_tokens=8, priority=LOW))
    sched.add(req("batch2", "def", max_tokens=8, priority=LOW))
    step(sched, engine)  # both prefill
    sched.add(req("chat", "ghij", max_tokens=3))
    sched.add(req("batch3", "klm", max_tokens=3, priority=LOW))
    plan = sched.schedule()
    assert ids(plan.steps) == ["chat"]
    sched.update(plan, engine.execute(plan.steps))
    assert sorted(ids(sched.schedule().steps)) == ["batch1", "batch2", "batch3", "chat"]
    outs = run(sched, engine)
    assert {rid: summary(o)[1] for rid, o in outs.items()} == dict.fromkeys(
        ["batch1", "batch2", "batch3", "chat"], "length"
    )


def test_equal_priorities_do_not_yield() -> None:
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=8, max_num_batched_tokens=16)
    sched.add(req("first", "abc", max_tokens=8))
    step(sched, engine)
    sched.add(req("second", "defg", max_tokens=3))
    assert ids(sched.schedule().steps) == ["first", "second"]


def test_a_starving_lower_priority_sequence_never_yields() -> None:
    """Aging keeps working: a batch sequence that has waited past aging_seconds counts as the highest priority."""
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=8, max_num_batched_tokens=16, aging_seconds=60, priority_grace_seconds=0)
    old = req("batch", "abc", max_tokens=8, priority=LOW)
    sched.add(old)
    step(sched, engine)
    old.arrival_time -= 3600
    sched.add(req("chat", "defg", max_tokens=3))
    assert ids(sched.schedule().steps) == ["batch", "chat"]


def test_lower_priorities_go_on_when_the_higher_request_cannot_be_admitted() -> None:
    """The chat finds no KV room (the batch sequence holds the pool): the batch's decode row is scheduled anyway."""
    engine = CountingEngine(num_blocks=3, block_size=4)
    sched = scheduler(
        engine, max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=False, priority_grace_seconds=0
    )
    sched.add(req("batch", "abcdefg", max_tokens=4, priority=LOW))  # 11 tokens in all: 3 blocks
    step(sched, engine)
    step(sched, engine)  # its first decode takes the third block
    sched.add(req("chat", "zyxwvuts", max_tokens=2))
    assert ids(sched.schedule().steps) == ["batch"]


def test_the_grace_window_keeps_lower_priorities_out_after_a_higher_request_finishes() -> None:
    """A chat finishes while another chat and a batch sequence decode: for the grace window the steps carry the
    other chat only, so the finished chat's follow-up lands in a short step and is prefilled alone; when nothing but
    the batch is left the plan is empty and says how long to idle; after the window the batch goes on."""
    engine = CountingEngine()
    grace = 0.2
    sched = scheduler(engine, max_num_seqs=8, max_num_batched_tokens=16, priority_grace_seconds=grace)
    sched.add(req("batch", "abc", max_tokens=40, priority=LOW))
    sched.add(req("chat1", "def", max_tokens=1))
    sched.add(req("chat2", "ghi", max_tokens=3))
    plan = sched.schedule()
    assert ids(plan.steps) == ["chat1", "chat2"]  # the batch request yields to their prefills
    sched.update(plan, engine.execute(plan.steps))
    # chat1 has finished (max_tokens=1): the window holds the batch out beside chat2's decodes
    plan = sched.schedule()
    assert ids(plan.steps) == ["chat2"]
    sched.update(plan, engine.execute(plan.steps))
    sched.add(req("chat3", "jkl", max_tokens=2))  # the follow-up: prefilled beside chat2, without the batch
    plan = sched.schedule()
    assert ids(plan.steps) == ["chat2", "chat3"]
    sched.update(plan, engine.execute(plan.steps))
    plan = sched.schedule()  # chat2 finished in that step: only chat3 decodes
    assert ids(plan.steps) == ["chat3"]
    sched.update(plan, engine.execute(plan.steps))
    plan = sched.schedule()  # chat3 finished: only the batch is left, held back; the driver idles
    assert plan.steps == [] and 0 < plan.idle_seconds <= grace
    time.sleep(plan.idle_seconds)
    assert ids(sched.schedule().steps) == ["batch"]


def test_without_a_grace_window_the_batch_runs_right_after_a_finish() -> None:
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=8, max_num_batched_tokens=16, priority_grace_seconds=0)
    sched.add(req("batch", "abc", max_tokens=40, priority=LOW))
    sched.add(req("chat", "def", max_tokens=1))
    plan = sched.schedule()
    assert ids(plan.steps) == ["chat"]
    assert summary(sched.update(plan, engine.execute(plan.steps)))[1] == "length"
    assert ids(sched.schedule().steps) == ["batch"]  # nothing holds it back any more


def test_decode_rows_that_sit_out_leave_their_room_to_proposals_within_the_exact_limit() -> None:
    """With at most 4 exact decode rows and 3 batch sequences decoding beside a chat, the chat's sequence has no
    room to verify proposals; in the step where they sit out (another chat prefills), it verifies some, and the
    step's decode rows stay within 4."""
    engine = VerifyingEngine()
    engine._info.max_exact_decode_rows = 4
    sched = scheduler(engine, max_num_seqs=8, max_num_batched_tokens=64, speculative=SPEC, priority_grace_seconds=0)
    sched.add(req("spec", "abcdefghijklmnopqrstuvwxyzabcde", max_tokens=40))
    for i in range(3):
        sched.add(req(f"batch{i}", "xyz", max_tokens=40, priority=LOW))
    step(sched, engine)  # the chat prefills alone
    step(sched, engine)  # the batch prefills beside the chat's decode
    plan = sched.schedule()
    assert len(plan.steps) == 4 and not any(s.num_draft_tokens for s in plan.steps)  # no room: 4 decode rows
    sched.update(plan, engine.execute(plan.steps))
    sched.add(req("chat", "mnop", max_tokens=2))
    plan = sched.schedule()
    assert ids(plan.steps) == ["spec", "chat"]
    assert plan.steps[0].num_draft_tokens > 0
    assert sum(len(s.token_ids) for s in plan.steps if is_decode(s)) <= 4
    sched.update(plan, engine.execute(plan.steps))
    outs = run(sched, engine)
    assert summary(outs["spec"])[1:] == ("length", 40)
