"""n-gram speculative decoding through the real server and the openai SDK: greedy answers are the same text as
the default server's (no speculation), streamed or not, with stop strings and max_tokens; the spec_decode counters
show proposals were made and accepted."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, ServerProcess, one_model_server, smollm2_config

PASSAGE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, polished the "
    "great lens, and wrote the weather in a leather logbook. Ships passing the reef at night steered by his "
    "light, and in forty years not one of them was lost."
)
CHATS = [
    f"Repeat this text exactly, word for word:\n\n{PASSAGE}",
    f"Here is a story:\n\n{PASSAGE}\n\nWhat did the keeper write in the logbook? Quote the story.",
    "Write a short poem about autumn leaves.",
]


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = smollm2_config(4096, "pytorch:\n  speculative: {num_speculative_tokens: 4}\n")
    with one_model_server(tmp_path_factory.mktemp("repo"), config) as proc:
        yield proc


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)


def _chat(server: ServerProcess, content: str, **kw: object) -> tuple[str, str]:
    reply = _client(server).chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": content}], temperature=0, **kw
    )
    return reply.choices[0].message.content or "", reply.choices[0].finish_reason


def test_greedy_answers_are_the_same_with_speculation(server: ServerProcess, spec_server: ServerProcess) -> None:
    drafted = spec_server.metric("switchyard_spec_decode_num_draft_tokens_total")
    accepted = spec_server.metric("switchyard_spec_decode_num_accepted_tokens_total")
    for content in CHATS:
        plain = _chat(server, content, max_tokens=64)
        assert _chat(spec_server, content, max_tokens=64) == plain, content[:40]
        stream = _client(spec_server).chat.completions.create(
            model=DEFAULT_MODEL,
            messages=[{"role": "user", "content": content}],
            temperature=0,
            max_tokens=64,
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == plain[0]
    assert spec_server.metric("switchyard_spec_decode_num_accepted_tokens_total") - accepted > 20
    assert spec_server.metric("switchyard_spec_decode_num_draft_tokens_total") > drafted


def test_stop_strings_and_max_tokens_land_where_they_do_without_speculation(
    server: ServerProcess, spec_server: ServerProcess
) -> None:
    for kw in ({"stop": ["logbook"], "max_tokens": 64}, {"max_tokens": 13}, {"stop": ["great lens"], "max_tokens": 64}):
        plain = _chat(server, CHATS[0], **kw)
        assert _chat(spec_server, CHATS[0], **kw) == plain, kw
    assert spec_server.wait_idle() == (0, 0, 0)


def test_sampled_requests_are_verified_too(spec_server: ServerProcess) -> None:
    """Unseeded sampling is speculated (rejection rule; its statistics are tested at the sampler): answers come
    whole, with the usage they report."""
    drafts = spec_server.metric("switchyard_spec_decode_num_drafts_total")
    for _ in range(3):
        reply = _client(spec_server).chat.completions.create(
            model=DEFAULT_MODEL, messages=[{"role": "user", "content": CHATS[0]}], temperature=0.3, max_tokens=48
        )
        choice = reply.choices[0]
        assert choice.finish_reason in ("stop", "length") and choice.message.content
        assert reply.usage.completion_tokens == 48 or choice.finish_reason == "stop"
    assert spec_server.metric("switchyard_spec_decode_num_drafts_total") > drafts
