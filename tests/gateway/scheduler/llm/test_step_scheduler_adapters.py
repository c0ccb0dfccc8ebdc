"""Requests under LoRA adapters in the continuous-batching policy: their rows carry the adapter, and the prefix
cache and KV sessions are keyed by it, so one adapter never reads the blocks another (or the base model) computed."""

from __future__ import annotations

from engines.types import AdapterRef, GenerationRequest
from tests.gateway.scheduler.llm.test_step_scheduler import CountingEngine, drain, req, scheduler

PROMPT = "abcdefghijklmnopq"  # 17 tokens: 4 full blocks of 4
SQL, CHAT = AdapterRef("sql", 1, "/a/sql"), AdapterRef("chat", 2, "/a/chat")


def _under(adapter: AdapterRef | None, rid: str, prompt: str = PROMPT, max_tokens: int = 2) -> GenerationRequest:
    r = req(rid, prompt, max_tokens=max_tokens)
    r.adapter = adapter
    return r


def _prefilled(engine: CountingEngine, seq_id: str) -> int:
    return sum(
        len(s.token_ids) for step in engine.steps for s in step if s.seq_id == seq_id and s.num_output_tokens == 0
    )


def test_rows_carry_their_adapter_and_blocks_are_not_shared_across_adapters() -> None:
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=64)
    drain(sched, engine, _under(None, "base"))
    drain(sched, engine, _under(SQL, "sql-1"))
    drain(sched, engine, _under(SQL, "sql-2"))
    drain(sched, engine, _under(CHAT, "chat"))
    drain(sched, engine, _under(AdapterRef("sql", 3, "/a/sql-v2"), "sql-reloaded"))
    drain(sched, engine, _under(None, "base-2"))
    assert {s.adapter_id for step in engine.steps for s in step if s.seq_id.startswith("sql-1")} == {1}
    assert {s.adapter_id for step in engine.steps for s in step if s.seq_id == "base"} == {0}
    assert _prefilled(engine, "sql-1") == 17  # the base model's blocks of the same prompt are not its own
    assert _prefilled(engine, "sql-2") == 1  # its own adapter's are
    assert _prefilled(engine, "chat") == 17
    assert _prefilled(engine, "sql-reloaded") == 17  # the same name loaded again: other weights, other blocks
    assert _prefilled(engine, "base-2") == 1


def test_mixed_batch_and_no_shared_prefill_across_adapters() -> None:
    """Requests of the same prompt under different adapters arriving together each compute it; they are batched."""
    engine = CountingEngine()
    sched = scheduler(engine, max_num_seqs=4, max_num_batched_tokens=64)
    for r in (_under(None, "b"), _under(SQL, "s"), _under(CHAT, "c")):
        sched.add(r)
    plan = sched.schedule()
    assert sorted((s.seq_id, s.adapter_id, len(s.token_ids)) for s in plan.steps) == [
        ("b", 0, 17),
        ("c", 2, 17),
        ("s", 1, 17),
    ]


def test_a_session_under_another_adapter_does_not_read_the_pinned_blocks() -> None:
    engine = CountingEngine(num_blocks=16, block_size=4)
    sched = scheduler(engine, max_num_batched_tokens=64, session_max_tokens=32)
    turn1 = _under(SQL, "t1", "abcdefghij", max_tokens=6)
    turn1.session_id = "s"
    text, _, _ = drain(sched, engine, turn1)
    assert sched.stats().session_pinned_blocks == 3
    other = _under(CHAT, "t2-chat", "abcdefghij" + text + "kk", max_tokens=1)
    other.session_id = "s"
    drain(sched, engine, other)
    assert _prefilled(engine, "t2-chat") == len("abcdefghij" + text + "kk")
    again = _under(SQL, "t2-sql", "abcdefghij" + text + "kk", max_tokens=1)
    drain(sched, engine, again)
    assert _prefilled(engine, "t2-sql") == len("abcdefghij" + text + "kk") - 12  # sql's blocks, still cached
