"""A stand-in for `tensorrt_llm` (which needs CUDA): the slice of its public LLM API that Switchyard uses.

Shapes follow TensorRT-LLM's documentation and source: `LLM(model=..., tokenizer=..., **options)`,
`generate_async(inputs, sampling_params=..., streaming=True)` returning a result that is an async iterator of
itself, `outputs[0]` with `text`/`token_ids`/`logprobs` and their `*_diff` views, `finish_reason` in
{"stop", "length", "cancelled"}, `result.abort()`, `SamplingParams` as a keyword-only dataclass, `RequestError`.

The "model" answers every prompt with a canned reply (default "The capital of France is Paris.", tokenized with
the tokenizer it was given) and then the end token, honouring max_tokens, stop_token_ids, end_id, ignore_eos,
logprobs, embedding_bias (a banned token is skipped) and logits processors (their mask is obeyed). Tests
inspect `LLM.instances` and each result.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar


class RequestError(RuntimeError):
    """A request failed (TensorRT-LLM's own class name)."""


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    embedding_bias: Any = None
    logits_processor: Any = None
    n: int = 1
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    finish_reason: str | None = None
    _last_text_len: int = 0
    _last_token_ids_len: int = 0
    _last_logprobs_len: int = 0

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]

    @property
    def logprobs_diff(self) -> list[Any]:
        return self.logprobs[self._last_logprobs_len :]


class GenerationResult:
    def __init__(self, llm: LLM, prompt: list[int], params: SamplingParams) -> None:
        self.llm = llm
        self.prompt_token_ids = prompt
        self.params = params
        self.outputs = [CompletionOutput(0)]
        self.finished = False
        self.aborted = False
        self._plan = list(llm.reply_ids)

    def abort(self) -> None:
        self.aborted = True

    def __aiter__(self) -> GenerationResult:
        return self

    async def __anext__(self) -> GenerationResult:
        if self.finished:
            raise StopAsyncIteration
        await asyncio.sleep(self.llm.step_seconds)
        out = self.outputs[0]
        out._last_text_len, out._last_token_ids_len, out._last_logprobs_len = (
            len(out.text),
            len(out.token_ids),
            len(out.logprobs),
        )
        if self.llm.fail_at is not None and len(out.token_ids) == self.llm.fail_at:
            raise self.llm.failure
        if self.aborted:
            self.finished, out.finish_reason = True, "cancelled"
            return self
        token = self._next_token()
        out.token_ids.append(token)
        if self.params.logprobs is not None:
            ranked = {token: Logprob(-0.25, 1), token + 1: Logprob(-1.5, 2), token + 2: Logprob(-3.0, 3)}
            out.logprobs.append({t: lp for t, lp in ranked.items() if lp.rank <= max(1, self.params.logprobs)})
        p = self.params
        if token == p.end_id and not p.ignore_eos:
            self.finished, out.finish_reason = True, "stop"
        elif p.stop_token_ids and token in p.stop_token_ids:
            self.finished, out.finish_reason = True, "stop"
        else:
            out.text = self.llm.decode(out.token_ids)
            if len(out.token_ids) >= p.max_tokens:
                self.finished, out.finish_reason = True, "length"
        return self

    def _next_token(self) -> int:
        import torch

        while True:
            token = self._plan.pop(0) if self._plan else self.params.end_id
            if self.params.ignore_eos and token == self.params.end_id:
                token = self.llm.filler_id
            vocab = self.llm.vocab_size
            logits = torch.zeros(1, vocab)
            logits[0, token] = 10.0
            if self.params.embedding_bias is not None:
                logits[0] += self.params.embedding_bias
            if self.params.logits_processor is not None:
                seq = [self.prompt_token_ids + self.outputs[0].token_ids]
                self.params.logits_processor(1, logits, seq, None, None)
            if math.isfinite(float(logits[0, token])) and float(logits[0, token]) > -50:
                return token
            # The planned token is banned: take the best allowed one instead.
            return int(torch.argmax(logits[0]))


class LLM:
    instances: ClassVar[list[LLM]] = []

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        reply: str = "The capital of France is Paris.",
        step_seconds: float = 0.0,
        **options: Any,
    ) -> None:
        from transformers import AutoTokenizer

        self.model = model
        self.options = options
        self._tok = AutoTokenizer.from_pretrained(tokenizer or model)
        self.vocab_size = len(self._tok)
        self.reply_ids = self._tok.encode(reply, add_special_tokens=False)
        self.filler_id = self._tok.encode(" more", add_special_tokens=False)[0]
        self.step_seconds = step_seconds
        self.fail_at: int | None = None
        self.failure: Exception = RequestError("request failed")
        self.results: list[GenerationResult] = []
        self.shut_down = False
        LLM.instances.append(self)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def generate_async(
        self, inputs: list[int], sampling_params: SamplingParams | None = None, streaming: bool = False
    ) -> GenerationResult:
        if not isinstance(inputs, list) or not all(isinstance(t, int) for t in inputs):
            raise TypeError("the stand-in takes prompt token ids")
        if not streaming:
            raise AssertionError("Switchyard always streams")
        result = GenerationResult(self, inputs, sampling_params or SamplingParams())
        self.results.append(result)
        return result

    def shutdown(self) -> None:
        self.shut_down = True
