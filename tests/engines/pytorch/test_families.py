"""Every decoder family the native engine serves, mixture-of-experts ones included, answers as transformers'
float32 does, from the family's HF folder (tests/family_models.py: tiny random-weight models made with transformers'
config classes; transformers' eager attention, which every family's attention is defined by): greedy tokens equal,
each token's logprob within 1e-4, batched with chunked prefill and decodes mixed, in the default kernels and in each
forced kernel path (the AVX2 build, no tile unit) and in torch ops alone. The one excuse for a different token is a
tie: the reference's top two logits closer than TIE; the test prints the smallest margins it met."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engines.pytorch import gemm_library, kernel_modes, native
from engines.pytorch.engine import PyTorchEngine
from engines.types import GenerationRequest, SamplingParams
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.continuous_batcher import ContinuousBatcher
from tests.family_models import DENSE, MOE, family_folder
from tests.greedy_reference import greedy_reference

NEW_TOKENS = 10
TIE = 1e-4
LOGPROB_TOLERANCE = 1e-4
# three prompts of 20 to 90 tokens: longer than the sliding windows (12) and, the last one, than LongRoPE's original
# length (64), so both of its tables are used; the shortest crosses it neither in prefill nor in decode
PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea, then explain it line by line. " * 2,
    "Summarize the plot of Romeo and Juliet, with its main characters and places. " * 6,
]
KERNEL_PATHS = ("default", "avx2", "no_tile_unit", "torch")
REPLAYED = (*MOE, "granite")  # families whose decode steps are checked to replay on the kernel paths (gpt-oss too)
# transformers' reference attention: its default (SDPA) leaves out Gemma 2's soft-capping of the scores
REFERENCE_ATTENTION = "eager"


_REFERENCES: dict[str, tuple[Path, list[list[int]], list[tuple[list[int], list[float], list[float]]]]] = {}


def _reference(name: str) -> tuple[Path, list[list[int]], list[tuple[list[int], list[float], list[float]]]]:
    """Family `name`'s folder, the prompts' ids and transformers' float32 greedy tokens, their logprobs and each
    step's top-two margin (made once per test session)."""
    if name not in _REFERENCES:
        folder = family_folder(name)
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation=REFERENCE_ATTENTION
        )
        tokenizer = AutoTokenizer.from_pretrained(folder)
        prompts = [tokenizer(p).input_ids for p in PROMPTS]
        refs = []
        for ids in prompts:
            ref = greedy_reference(model, ids, NEW_TOKENS)
            refs.append((ref.tokens, ref.logprobs, ref.margins))
        _REFERENCES[name] = (folder, prompts, refs)
    return _REFERENCES[name]


def _force(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel build a CPU without AVX-512 gets (AVX2), or this CPU's without its tile unit (no AMX)."""
    if path in ("avx2", "no_tile_unit"):
        monkeypatch.setattr(kernel_modes, "TILE_UNIT", False)
    if path == "avx2":
        monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, "-mno-avx512f"])
        monkeypatch.setattr(native, "_loaded", {})
        monkeypatch.setattr(gemm_library, "_lib", None)


async def _generate(engine: PyTorchEngine, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    # a small token budget: prompts are prefilled in chunks, beside the other prompts' decodes
    batcher = ContinuousBatcher(engine, SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=24))
    await batcher.start()

    async def run(i: int, ids: list[int]) -> tuple[list[int], list[float]]:
        await asyncio.sleep(0.02 * i)
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=0, ignore_eos=True)
        tokens, logprobs = [], []
        async for out in batcher.generate(GenerationRequest(f"r{i}", ids, params)):
            tokens.extend(out.new_token_ids)
            logprobs.extend(lp.logprob for lp in out.logprobs or [])
        return tokens, logprobs

    try:
        return await asyncio.gather(*(run(i, p) for i, p in enumerate(prompts)))
    finally:
        await batcher.stop()


@pytest.mark.parametrize("path", KERNEL_PATHS)
@pytest.mark.parametrize("family", DENSE + MOE)
def test_family_greedy_equals_transformers_float32(family: str, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, prompts, refs = _reference(family)
    _force(path, monkeypatch)
    engine = PyTorchEngine(
        folder, dtype="float32", kv_cache_tokens=1024, block_size=16, gemm_threads=1, fast_kernels=path != "torch"
    )
    ours = asyncio.run(_generate(engine, prompts))
    margins = []
    for (tokens, logprobs), (ref_tokens, ref_logprobs, ref_margins) in zip(ours, refs, strict=True):
        assert len(tokens) == NEW_TOKENS and len(logprobs) == NEW_TOKENS
        for step, (got, want) in enumerate(zip(tokens, ref_tokens, strict=True)):
            margins.append(ref_margins[step])
            if got != want:
                assert ref_margins[step] < TIE, (family, path, step, tokens, ref_tokens, ref_margins[step])
                break  # a tie: the rest follows another token
            assert abs(logprobs[step] - ref_logprobs[step]) <= LOGPROB_TOLERANCE, (family, path, step)
    print(f"{family} [{path}]: smallest top-two margins {sorted(margins)[:3]}")
    replay = engine._runner._replay
    if family in REPLAYED and replay is not None:
        # the MoE block is one C call (moe_experts.py; gpt-oss's biased experts and clamped SwiGLU included),
        # Granite's multipliers kernels (dense_ops.DenseOps): decode steps are kernel calls only, and the replay's
        # second-step check (its logits equal to the Python forward's, bit for bit) keeps them replaying
        states = {rows: replay.plan_state(rows) for rows in range(1, 5)}
        assert "off" not in states.values() and "replayed" in states.values(), states
