"""Qwen3-MoE and Mixtral through the native engine (batched, paged, chunked prefill) against transformers' greedy
generate in float32: token for token, the chosen tokens' logprobs within 1e-4, on this CPU's kernels, the AVX2
build, with the tile unit off and on torch ops only. Tiny random-weight folders (tests/family_models.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from engines.pytorch import linear, native
from engines.pytorch.engine import PyTorchEngine
from engines.types import GenerationRequest, SamplingParams
from gateway.scheduler.llm.continuous_batcher import ContinuousBatcher
from gateway.scheduler.llm.step_scheduler import BatcherLimits
from tests.family_models import family_folder

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "Explain photosynthesis briefly. " * 5,
           "1, 2, 3, 4,"]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    cache = tmp_path_factory.mktemp("families")
    return {name: family_folder(name, cache) for name in ("qwen3_moe", "mixtral")}


def _reference(folder: Path, prompts: list[list[int]]) -> list[tuple[list[int], list[float], list[float]]]:
    """transformers' greedy tokens, their logprobs and the top-two margins (how far from a tie each step was)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    for ids in prompts:
        gen = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=model.config.eos_token_id)
        tokens = gen.sequences[0, len(ids):].tolist()
        logprobs = [torch.log_softmax(s[0].float(), -1) for s in gen.logits]
        top2 = [lp.topk(2).values for lp in logprobs]
        out.append((tokens, [float(lp[t]) for lp, t in zip(logprobs, tokens, strict=True)],
                    [float(a - b) for a, b in top2]))
    return out


async def _generate(engine: PyTorchEngine, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    # a small token budget: prefill chunks beside running decodes, several sequences' rows in a step
    batcher = ContinuousBatcher(engine, BatcherLimits(max_num_seqs=4, max_num_batched_tokens=24))
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


@pytest.fixture
def kernel_path(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """Force a kernel path: the libraries rebuilt without AVX-512, or the tile unit (AMX) off."""
    if request.param == "avx2":
        monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, "-mno-avx512f"])
        for name in ("gemm", "paged_attention"):
            monkeypatch.delitem(native._loaded, name, raising=False)
        monkeypatch.setattr(linear, "_lib", None)
    elif request.param == "no-tile-unit":
        monkeypatch.setattr(linear, "TILE_UNIT", False)
    return request.param


@pytest.mark.parametrize("kernel_path", ["native", "avx2", "no-tile-unit", "torch"], indirect=True)
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_greedy_equals_transformers(family: str, kernel_path: str, folders: dict[str, Path], tmp_path: Path) -> None:
    folder = folders[family]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    engine = PyTorchEngine(folder, dtype="float32", kv_cache_tokens=1024, block_size=16, cache_dir=tmp_path,
                           fast_kernels=kernel_path != "torch", gemm_threads=1)
    assert engine.info.model_type == family
    ours = asyncio.run(_generate(engine, prompts))
    for (tokens, logprobs), (ref_tokens, ref_logprobs, margins) in zip(ours, _reference(folder, prompts),
                                                                       strict=True):
        assert tokens == ref_tokens, f"margins of the reference's top two: {margins}"
        assert max(abs(a - b) for a, b in zip(logprobs, ref_logprobs, strict=True)) < 1e-4
