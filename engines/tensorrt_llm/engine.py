"""`TensorRTLLMEngine`: TensorRT-LLM's `LLM` API behind our `AsyncGenerateEngine` contract.

Written against the public LLM API only: `tensorrt_llm.LLM(model=..., ...)`, `llm.generate_async(prompt_token_ids,
sampling_params=..., streaming=True)` returning a result that is an async iterator of itself, whose `outputs[0]`
carries `text_diff`, `token_ids_diff`, `logprobs_diff` and `finish_reason`, and `result.abort()`.
`tensorrt_llm` is imported when the engine is built (never at module import): it needs CUDA, so it cannot run on
CPU-only machines; the tests drive this adapter with a stand-in that mimics that API.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from engines.hf_tokenizer import HFTokenizer
from engines.interface import AsyncGenerateEngine, EngineUnavailableError, Tokenizer
from engines.tensorrt_llm.sampling import to_token_logprobs, to_trtllm_sampling_params
from engines.types import EngineInfo, GenerationOutput, GenerationRequest

log = logging.getLogger("switchyard.engines.tensorrt_llm")

_FINISH = {"stop": "stop", "length": "length", "cancelled": "abort"}


def import_tensorrt_llm() -> Any:
    """The `tensorrt_llm` module; ImportError says how to get it."""
    try:
        return importlib.import_module("tensorrt_llm")
    except ImportError as exc:
        raise ImportError(
            "backend 'tensorrt_llm' needs TensorRT-LLM (NVIDIA GPUs with CUDA only) installed beside Switchyard; "
            "TensorRT-LLM 1.x pins older transformers/fastapi than Switchyard's, so serve it with trtllm-serve in its "
            f"own environment behind a 'backend: remote' model (docs/cpu.md, TensorRT-LLM) ({exc})"
        ) from exc


class TensorRTLLMEngine(AsyncGenerateEngine):
    def __init__(
        self,
        model: Path,
        tokenizer: HFTokenizer,
        *,
        dtype: str = "auto",
        max_model_len: int | None = None,
        max_num_seqs: int = 32,
        tensor_parallel_size: int = 1,
        kv_cache_free_gpu_memory_fraction: float = 0.9,
        enable_block_reuse: bool = True,
        llm_args: dict[str, Any] | None = None,
    ) -> None:
        """Build the `LLM` (blocking: loads or builds the engine). `model` is an HF folder or an engine folder."""
        trt = import_tensorrt_llm()
        from tensorrt_llm.llmapi import KvCacheConfig  # type: ignore[import-not-found]

        kwargs: dict[str, Any] = {
            "model": str(model),
            "tokenizer": str(model),
            "dtype": dtype,
            "tensor_parallel_size": tensor_parallel_size,
            "max_batch_size": max_num_seqs,
            "kv_cache_config": KvCacheConfig(
                free_gpu_memory_fraction=kv_cache_free_gpu_memory_fraction, enable_block_reuse=enable_block_reuse
            ),
        }
        if max_model_len is not None:
            kwargs["max_seq_len"] = max_model_len
        kwargs.update(llm_args or {})
        self._trt = trt
        self._llm = trt.LLM(**kwargs)
        self._tokenizer = tokenizer
        self._results: dict[str, Any] = {}
        self._dead = False
        hf = tokenizer.hf
        self._eos = hf.eos_token_id
        self._info = EngineInfo(
            model_type="tensorrt_llm",
            dtype=dtype,
            max_model_len=max_model_len or _context_length(model, hf),
            vocab_size=tokenizer.vocab_size,
            eos_token_ids=[self._eos] if self._eos is not None else [],
        )

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def healthy(self) -> bool:
        return not self._dead

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        if self._dead:
            raise EngineUnavailableError("the TensorRT-LLM engine has stopped; the model is unavailable")
        params = to_trtllm_sampling_params(request.sampling, self._trt, self._info.vocab_size, self._eos)
        prompt_tokens = len(request.prompt_token_ids)
        k = request.sampling.logprobs or 0
        try:
            result = self._llm.generate_async(list(request.prompt_token_ids), sampling_params=params, streaming=True)
        except ValueError:
            raise  # TensorRT-LLM refuses the request (e.g. too long): 400
        except Exception as exc:
            self._dead = True
            log.exception("TensorRT-LLM refused a request; marking the engine unavailable")
            raise EngineUnavailableError("the TensorRT-LLM engine failed; the model is unavailable") from exc
        self._results[request.request_id] = result
        produced = 0
        try:
            async for step in result:
                seq = step.outputs[0]
                new_ids = list(seq.token_ids_diff)
                produced += len(new_ids)
                finished = bool(step.finished)
                reason = _FINISH.get(seq.finish_reason or "stop", "error") if finished else None
                wanted = request.sampling.logprobs is not None
                logprobs = to_token_logprobs(new_ids, seq.logprobs_diff, k) if wanted else None
                text = seq.text_diff
                if not (text or new_ids or finished):
                    continue
                yield GenerationOutput(
                    request_id=request.request_id,
                    new_token_ids=new_ids,
                    text=text,
                    finished=finished,
                    finish_reason=reason,
                    prompt_tokens=prompt_tokens,
                    completion_tokens=produced,
                    cached_prompt_tokens=int(getattr(step, "cached_tokens", 0) or 0),
                    logprobs=logprobs,
                    error="TensorRT-LLM cancelled the request" if reason == "abort" else None,
                )
                if finished:
                    return
        except Exception as exc:
            # TensorRT-LLM's RequestError fails one request; anything else is the executor itself.
            if type(exc).__name__ != "RequestError":
                self._dead = True
            log.error("TensorRT-LLM failed on request %s: %s", request.request_id, exc)
            yield GenerationOutput(
                request_id=request.request_id,
                new_token_ids=[],
                text="",
                finished=True,
                finish_reason="error",
                prompt_tokens=prompt_tokens,
                completion_tokens=produced,
                error="the TensorRT-LLM engine failed while generating; see the server log",
            )
        finally:
            self._results.pop(request.request_id, None)
            if not getattr(result, "finished", True):
                await _abort(result)

    async def abort(self, request_id: str) -> None:
        result = self._results.pop(request_id, None)
        if result is not None:
            await _abort(result)

    async def shutdown(self) -> None:
        await asyncio.to_thread(self._llm.shutdown)


async def _abort(result: Any) -> None:
    try:
        outcome = result.abort()
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:  # already finished or the executor is gone: nothing left to stop
        log.debug("abort failed", exc_info=True)


def _context_length(model: Path, hf_tokenizer: Any) -> int:
    """The model's context length from its HF config, else the tokenizer's; 2048 if neither says."""
    import json

    config = model / "config.json"
    if config.is_file():
        try:
            value = json.loads(config.read_text()).get("max_position_embeddings")
            if isinstance(value, int) and value > 0:
                return value
        except (OSError, ValueError):
            pass
    value = getattr(hf_tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 10**7 else 2048
