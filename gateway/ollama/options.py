"""Ollama's `options` -> the chat/completions sampling fields the OpenAI path reads.

Mapped: `temperature`, `top_p`, `top_k`, `min_p`, `seed` (negative: random, as Ollama's -1), `num_predict` (-1 and
-2: until the context is full), `stop`, `repeat_penalty` (vLLM's `repetition_penalty`, over the prompt and the
answer), `presence_penalty`, `frequency_penalty`. `num_ctx` is checked (a positive count) but the context window is
the model's `max_model_len`, set in its config. Options that are absent keep the server's defaults (those of
/v1/chat/completions), not Ollama's. Other Ollama options are accepted and ignored, as Ollama ignores the ones its
runner does not use: the load-time ones (`num_gpu`, `num_thread`, `use_mmap`, ...) are the server's configuration,
and the samplers this server does not have (`mirostat`, `typical_p`, `tfs_z`, `repeat_last_n`, ...) are logged.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import Field, StrictStr, ValidationError

from gateway.errors import InvalidRequestError
from gateway.openai.protocol import MAX_STOP_LENGTH, MAX_STOP_SEQUENCES, _Lenient

log = logging.getLogger("switchyard.ollama")

# Ollama's load-time options: the server's config decides them (silently ignored, as they are on a loaded model)
LOAD_OPTIONS = frozenset(
    {
        "numa",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mmap",
        "use_mlock",
        "embedding_only",
        "num_thread",
        "num_keep",
    }
)


class Options(_Lenient):
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    num_predict: int | None = Field(None, ge=-2)
    stop: list[StrictStr] | StrictStr | None = None
    repeat_penalty: float | None = Field(None, gt=0.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    num_ctx: int | None = Field(None, ge=1)


def read_options(raw: dict[str, Any] | None) -> Options:
    """The request's options, checked; a 400 naming `options.<name>` for a bad value."""
    try:
        options = Options.model_validate(raw or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if not str(p).startswith(("list[", "str")))
        raise InvalidRequestError(
            f"options.{where}: {first.get('msg', 'invalid value')}"[:300], param=f"options.{where}"
        ) from None
    ignored = sorted(set(options.model_extra or {}) - LOAD_OPTIONS)
    if ignored:
        log.info("ollama: ignoring options this server does not have: %s", ignored[:20])
    return options


def _stops(stop: list[str] | str | None) -> list[str] | None:
    stops = [stop] if isinstance(stop, str) else stop
    if not stops:
        return None
    if len(stops) > MAX_STOP_SEQUENCES or any(not s or len(s) > MAX_STOP_LENGTH for s in stops):
        raise InvalidRequestError(
            f"options.stop: at most {MAX_STOP_SEQUENCES} sequences of 1 to {MAX_STOP_LENGTH} characters",
            param="options.stop",
        )
    return stops


def _max_tokens(num_predict: int | None) -> int | None:
    if num_predict is None or num_predict < 0:
        return None  # -1 (Ollama's default) and -2: until the context is full
    if num_predict == 0:
        raise InvalidRequestError(
            "options.num_predict: must be a positive count of tokens, or -1 for no limit", param="options.num_predict"
        )
    return num_predict


def sampling_fields(options: Options, max_model_len: int | None) -> dict[str, Any]:
    """The chat/completions request fields the options set (absent options are left out)."""
    if options.num_ctx is not None and max_model_len and options.num_ctx > max_model_len:
        log.info(
            "ollama: num_ctx %d is more than the model's context of %d tokens (its max_model_len); the "
            "context stays %d",
            options.num_ctx,
            max_model_len,
            max_model_len,
        )
    fields = {
        "temperature": options.temperature,
        "top_p": options.top_p,
        "top_k": options.top_k,
        "min_p": options.min_p,
        "seed": options.seed if options.seed is not None and options.seed >= 0 else None,
        "max_tokens": _max_tokens(options.num_predict),
        "stop": _stops(options.stop),
        "repetition_penalty": options.repeat_penalty,
        "presence_penalty": options.presence_penalty,
        "frequency_penalty": options.frequency_penalty,
    }
    return {k: v for k, v in fields.items() if v is not None}
