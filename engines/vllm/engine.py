"""`VllmEngine`: vLLM's `AsyncLLM` in this process, behind our `AsyncGenerateEngine` contract.

vLLM batches, caches prefixes and schedules by priority itself; the gateway's admission scheduler decides what
enters it. Prompts arrive as token ids (the gateway rendered the chat template with the same tokenizer) and go in
as vLLM `TokensInput`, so no text is tokenized twice. vLLM runs its engine core in a child process (spawned): a
program that builds this engine must guard its entry point with `if __name__ == "__main__"` (`python -m gateway`
does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from engines.hf_tokenizer import HFTokenizer
from engines.interface import AsyncGenerateEngine, EngineUnavailableError, RequestRefusedError, Tokenizer
from engines.types import AdapterRef, EngineInfo, GenerationOutput, GenerationRequest
from engines.vllm.sampling import to_token_logprobs, to_vllm_sampling_params

log = logging.getLogger("switchyard.engines.vllm")

_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}


def engine_args(
    folder: Path,
    *,
    dtype: str,
    max_model_len: int | None,
    max_num_seqs: int,
    kv_cache_memory_gib: float,
    enable_prefix_caching: bool,
    enforce_eager: bool,
    extra: dict[str, Any] | None = None,
    enable_lora: bool = False,
) -> Any:
    """vLLM's `AsyncEngineArgs` from our config; ValueError names an unknown `engine_args` key. `enable_lora`: the
    model's config lists LoRA adapters (vLLM's `enable_lora`; `engine_args` may set it, and `max_lora_rank`, too)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    known = set(AsyncEngineArgs.__dataclass_fields__)
    unknown = sorted(set(extra or {}) - known)
    if unknown:
        raise ValueError(f"vllm.engine_args: unknown vLLM engine argument(s) {unknown}; check vLLM's EngineArgs")
    args: dict[str, Any] = {
        "model": str(folder),
        "tokenizer": str(folder),
        "dtype": dtype,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "kv_cache_memory_bytes": int(kv_cache_memory_gib * 2**30),
        "enable_prefix_caching": enable_prefix_caching,
        "enforce_eager": enforce_eager,
        "scheduling_policy": "priority",  # our requests carry priorities; vLLM refuses them under "fcfs"
        "disable_log_stats": True,
        # Guided decoding with llguidance, as on the native engine: it reads our `x-guidance` JSON formatting and
        # the Lark tool-call grammars (`%json`), which xgrammar (vLLM's "auto" first pick) does not.
        "structured_outputs_config": {"backend": "guidance"},
    }
    if enable_lora:
        args["enable_lora"] = True
    args.update(extra or {})
    if isinstance(args["structured_outputs_config"], dict):
        from vllm.config import StructuredOutputsConfig

        args["structured_outputs_config"] = StructuredOutputsConfig(**args["structured_outputs_config"])
    return AsyncEngineArgs(**args)


class VllmEngine(AsyncGenerateEngine):
    def __init__(self, folder: Path, args: Any, dtype: str) -> None:
        """Start vLLM (blocking: loads weights, profiles, warms up). `args` comes from `engine_args`."""
        from transformers import AutoTokenizer
        from vllm.v1.engine.async_llm import AsyncLLM

        self._llm = AsyncLLM.from_engine_args(args)
        self._lora = bool(getattr(args, "enable_lora", False))
        self._tokenizer = HFTokenizer(AutoTokenizer.from_pretrained(folder))
        self._info = self._describe(dtype)

    def _describe(self, dtype: str) -> EngineInfo:
        model_config = self._llm.model_config
        cache_config = self._llm.vllm_config.cache_config
        hf = self._tokenizer.hf
        eos: list[int] = []
        gen = getattr(model_config, "hf_config", None)
        for candidate in (getattr(gen, "eos_token_id", None), hf.eos_token_id):
            for token in candidate if isinstance(candidate, list) else [candidate]:
                if isinstance(token, int) and token not in eos:
                    eos.append(token)
        return EngineInfo(
            model_type=str(getattr(model_config.hf_config, "model_type", "unknown")),
            dtype=dtype,
            max_model_len=int(model_config.max_model_len),
            vocab_size=int(model_config.get_vocab_size()),
            eos_token_ids=eos,
            block_size=int(cache_config.block_size or 16),
            num_kv_blocks=int(cache_config.num_gpu_blocks or 0),
        )

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def healthy(self) -> bool:
        return not self._llm.errored

    @property
    def enforces_guided_spec(self) -> bool:
        return True  # vLLM's structured outputs (sampling.py)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import tokens_input
        from vllm.v1.engine.exceptions import EngineDeadError

        params = to_vllm_sampling_params(request.sampling)
        prompt_tokens = len(request.prompt_token_ids)
        k = request.sampling.logprobs or 0
        k_wanted = request.sampling.logprobs is not None
        produced = 0
        started = False
        stream = self._llm.generate(
            tokens_input(list(request.prompt_token_ids)),
            params,
            request.request_id,
            priority=request.priority,
            lora_request=_lora_request(request),
        )
        try:
            # Closing vLLM's generator (when ours is closed) is what aborts the request inside vLLM.
            async with contextlib.aclosing(stream):
                async for out in stream:
                    seq = out.outputs[0]
                    produced += len(seq.token_ids)
                    reason = None
                    if out.finished:
                        reason = _FINISH.get(seq.finish_reason or "stop", "error")
                    if not (seq.text or seq.token_ids or out.finished):
                        continue
                    started = True
                    update = GenerationOutput(
                        request_id=request.request_id,
                        new_token_ids=list(seq.token_ids),
                        text=seq.text,
                        finished=out.finished,
                        finish_reason=reason,
                        prompt_tokens=prompt_tokens,
                        completion_tokens=produced,
                        cached_prompt_tokens=int(out.num_cached_tokens or 0),
                        logprobs=to_token_logprobs(seq.token_ids, seq.logprobs, k) if k_wanted else None,
                        error="vLLM aborted the request" if reason == "abort" else None,
                    )
                    if out.finished:
                        # Let vLLM's generator run to its end before handing over the last update: closing it
                        # while suspended would make vLLM "abort" a request that has already finished.
                        async for _ in stream:
                            pass
                    yield update
                    if out.finished:
                        return
        except EngineDeadError:
            log.error("vLLM's engine died (request %s)", request.request_id)
            if not started:
                raise EngineUnavailableError("the vLLM engine has stopped; the model is unavailable") from None
            yield _failed(request, produced, "the vLLM engine stopped while generating")
        except VLLMClientError as exc:
            if not started:
                raise RequestRefusedError(str(exc)[:500], _refused_param(exc, request)) from None
            yield _failed(request, produced, f"vLLM refused the request: {str(exc)[:300]}")

    def load_adapter(self, adapter: AdapterRef) -> None:
        """vLLM reads the adapter itself when a request first names it (its `LoRARequest`); checked here for what
        it cannot take."""
        if not self._lora:
            raise RequestRefusedError(
                "vLLM was started without LoRA support; list the adapters in the model's "
                "lora_adapters, or set vllm.engine_args.enable_lora: true",
                "lora_path",
            )
        if not Path(adapter.path).is_dir():
            raise RequestRefusedError(
                "vLLM loads PEFT adapter folders (adapter_config.json and "
                "adapter_model.safetensors), not GGUF LoRA files; give the folder",
                "lora_path",
            )

    async def abort(self, request_id: str) -> None:
        if not self._llm.errored:
            await self._llm.abort(request_id)

    async def shutdown(self) -> None:
        await asyncio.to_thread(self._llm.shutdown)


def _lora_request(request: GenerationRequest) -> Any:
    """vLLM's `LoRARequest` of the request's adapter, or None."""
    if request.adapter is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest(request.adapter.name, request.adapter.id, request.adapter.path)


def _refused_param(exc: BaseException, request: GenerationRequest) -> str | None:
    """The request field a vLLM refusal is about: the one vLLM names, else the guided spec's field when vLLM's
    structured-output checks raised it (their errors name no parameter)."""
    named = getattr(exc, "parameter", None)
    if isinstance(named, str):
        return named
    guided = request.sampling.guided
    if guided is None:
        return None
    frames = traceback.walk_tb(exc.__traceback__)
    in_guided_check = any("structured_output" in f.f_code.co_name + f.f_code.co_filename for f, _ in frames)
    return guided.param if in_guided_check else None


def _failed(request: GenerationRequest, produced: int, error: str) -> GenerationOutput:
    return GenerationOutput(
        request_id=request.request_id,
        new_token_ids=[],
        text="",
        finished=True,
        finish_reason="error",
        prompt_tokens=len(request.prompt_token_ids),
        completion_tokens=produced,
        error=error,
    )
