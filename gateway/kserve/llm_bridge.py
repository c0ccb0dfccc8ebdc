"""LLMs over the v2 protocol: Triton's generate extension and text tensors for infer / stream infer.

Triton's LLM backends (vLLM, TensorRT-LLM) take `text_input` and return `text_output`; sampling settings come as
request parameters or, for generate, as top-level fields. The same names work here:
`max_tokens` (default 16), `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `stop` (string or list),
`presence_penalty`, `frequency_penalty`, `repetition_penalty`, `min_tokens`, `ignore_eos`, and Triton's `timeout`
(microseconds a request may wait in the model's queue before it starts; see gateway/scheduler/llm/queue_policy.py).
Streams carry text deltas; the non-streaming answer carries the whole text (without the prompt).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import numpy as np

from engines.types import GenerationRequest, SamplingParams
from gateway.errors import InternalError, InvalidRequestError, ServiceUnavailableError
from gateway.http.ids import random_hex
from gateway.keys import context as key_context
from gateway.kserve.codec import InputTensor
from gateway.repository.loaded_model import LoadedLLM

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
_MAX_STOPS = 64
# name -> (type, low, high); None bound = open.
_NUMERIC: dict[str, tuple[type, float | None, float | None]] = {
    "max_tokens": (int, 1, None),
    "min_tokens": (int, 0, None),
    "temperature": (float, 0.0, 2.0),
    "top_p": (float, 0.0, 1.0),
    "top_k": (int, -1, None),
    "min_p": (float, 0.0, 1.0),
    "seed": (int, 0, 2**63 - 1),
    "presence_penalty": (float, -2.0, 2.0),
    "frequency_penalty": (float, -2.0, 2.0),
    "repetition_penalty": (float, 0.01, 10.0),
}
_FLAGS = ("ignore_eos",)
TIMEOUT = "timeout"  # Triton's request parameter, in microseconds
_MAX_TIMEOUT_US = 3600 * 10**6
#: Tensor-only inputs of the LLM model as seen over v2 (besides text_input): scalars or flags.
LLM_INPUTS = [TEXT_INPUT, "max_tokens", "stream", "temperature", "top_p", "top_k", "seed", "ignore_eos"]


def _number(name: str, value: Any) -> float | int:
    kind, low, high = _NUMERIC[name]
    if isinstance(value, (np.generic, np.ndarray)):
        value = np.asarray(value).ravel()[0].item() if np.asarray(value).size == 1 else value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(f"'{name}' must be a number")
    if kind is int:
        if isinstance(value, float) and not value.is_integer():
            raise InvalidRequestError(f"'{name}' must be an integer")
        value = int(value)
    elif not math.isfinite(value):
        raise InvalidRequestError(f"'{name}' must be finite")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise InvalidRequestError(f"'{name}' must be {bounds}")
    return value


def sampling_from(values: Mapping[str, Any], max_model_len: int, prompt_len: int) -> SamplingParams:
    """Validated sampling settings from generate fields / request parameters."""
    params: dict[str, Any] = {}
    for name in _NUMERIC:
        if values.get(name) is not None:
            params[name] = _number(name, values[name])
    for name in _FLAGS:
        if name in values:
            flag = values[name]
            if isinstance(flag, np.ndarray):
                flag = bool(flag.ravel()[0]) if flag.size == 1 else flag
            if not isinstance(flag, (bool, np.bool_)):
                raise InvalidRequestError(f"'{name}' must be true or false")
            params[name] = bool(flag)
    stop = values.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if (
            not isinstance(stop, list)
            or not all(isinstance(s, str) and 0 < len(s) <= 1024 for s in stop)
            or len(stop) > _MAX_STOPS
        ):
            raise InvalidRequestError(f"'stop' must be a string or a list of at most {_MAX_STOPS} non-empty strings")
        params["stop"] = stop
    max_tokens = params.pop("max_tokens", 16)
    if prompt_len + max_tokens > max_model_len:
        raise InvalidRequestError(
            f"the prompt ({prompt_len} tokens) plus max_tokens ({max_tokens}) exceeds the model's context of "
            f"{max_model_len} tokens"
        )
    if params.get("min_tokens", 0) > max_tokens:
        raise InvalidRequestError("'min_tokens' must not exceed 'max_tokens'")
    top_k = params.pop("top_k", 0)
    return SamplingParams(max_tokens=max_tokens, top_k=max(0, top_k), **params)


def _text(value: Any, where: str) -> str:
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise InvalidRequestError(f"{where} must hold exactly one text")
        value = value.ravel()[0]
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequestError(f"{where} must be UTF-8") from None
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{where} must be a non-empty string")
    return value


async def generate_text(model: LoadedLLM, prompt: str, values: Mapping[str, Any]) -> AsyncIterator[str]:
    """Run one generation and yield its text deltas; errors surface as SwitchyardError."""
    scheduler = model.scheduler
    prompt_ids = scheduler.tokenizer.encode(prompt)
    if not prompt_ids:
        raise InvalidRequestError("text_input produced no tokens")
    sampling = sampling_from(values, scheduler.info.max_model_len, len(prompt_ids))
    request = GenerationRequest(
        f"v2-{random_hex()}", prompt_ids, sampling, key_context.priority(0), queue_timeout=_queue_timeout(values)
    )
    async for out in scheduler.generate(request):
        if out.finish_reason == "error":
            raise InternalError(out.error or "the model failed while generating")
        if out.finish_reason == "abort":
            raise ServiceUnavailableError(out.error or "the request was aborted", headers={"Retry-After": "1"})
        if out.text:
            yield out.text


def _queue_timeout(values: Mapping[str, Any]) -> float | None:
    """Triton's `timeout` (microseconds; 0 or absent: the model's default) in seconds."""
    value = values.get(TIMEOUT)
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.ravel()[0].item()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TIMEOUT_US:
        raise InvalidRequestError(f"'{TIMEOUT}' must be an integer number of microseconds from 0 to {_MAX_TIMEOUT_US}")
    return value / 1e6 if value else None


def generate_body(body: Any) -> tuple[str, dict[str, Any]]:
    """Split a generate request body into the prompt and the sampling settings."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    values = dict(body.get("parameters") or {})
    if not isinstance(body.get("parameters", {}), dict):
        raise InvalidRequestError("'parameters' must be a JSON object")
    for key, value in body.items():
        if key in ("parameters", TEXT_INPUT, "id", "stream"):
            continue
        if key not in _NUMERIC and key not in _FLAGS and key not in ("stop", TIMEOUT):
            raise InvalidRequestError(
                f"unexpected field '{key[:64]}'; the model takes text_input and sampling settings"
            )
        values[key] = value
    return _text(body.get(TEXT_INPUT), TEXT_INPUT), values


def infer_values(inputs: Sequence[InputTensor], parameters: Mapping[str, Any]) -> tuple[str, dict[str, Any], bool]:
    """Prompt, sampling settings and the `stream` flag from v2 infer inputs plus request parameters."""
    tensors = {t.name: t.array for t in inputs}
    unknown = [n for n in tensors if n not in LLM_INPUTS]
    if unknown:
        raise InvalidRequestError(f"unexpected input '{unknown[0][:64]}'; the model takes {', '.join(LLM_INPUTS)}")
    if TEXT_INPUT not in tensors:
        raise InvalidRequestError("the model needs input 'text_input' (BYTES)")
    values = {k: v for k, v in parameters.items() if k in _NUMERIC or k in _FLAGS or k in ("stop", TIMEOUT)}
    for name, array in tensors.items():
        if name in (TEXT_INPUT, "stream"):
            continue
        if array.size != 1:
            raise InvalidRequestError(f"input '{name}' must hold one value")
        values[name] = array.ravel()[0].item() if array.dtype != object else array.ravel()[0]
    stream = bool(tensors["stream"].ravel()[0]) if "stream" in tensors and tensors["stream"].size else False
    return _text(tensors[TEXT_INPUT], "text_input"), values, stream


def llm_metadata(model: LoadedLLM) -> dict[str, Any]:
    return {
        "name": model.name,
        "versions": ["1"],
        "platform": model.config.backend,
        "inputs": [
            {"name": TEXT_INPUT, "datatype": "BYTES", "shape": [1]},
            {"name": "max_tokens", "datatype": "INT32", "shape": [1]},
            {"name": "stream", "datatype": "BOOL", "shape": [1]},
        ],
        "outputs": [{"name": TEXT_OUTPUT, "datatype": "BYTES", "shape": [1]}],
    }


def llm_config(model: LoadedLLM) -> dict[str, Any]:
    return {
        "name": model.name,
        "backend": model.config.backend,
        "max_batch_size": 0,
        "input": [
            {"name": TEXT_INPUT, "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "max_tokens", "data_type": "TYPE_INT32", "dims": [1], "optional": True},
            {"name": "stream", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
        ],
        "output": [{"name": TEXT_OUTPUT, "data_type": "TYPE_STRING", "dims": [-1]}],
        "model_transaction_policy": {"decoupled": True},
        "instance_group": [{"name": model.name, "kind": "KIND_CPU", "count": 1}],
        "parameters": {"max_model_len": {"string_value": str(model.max_model_len)}},
    }


def text_tensor(text: str) -> np.ndarray:
    return np.array([text.encode("utf-8")], dtype=object)
