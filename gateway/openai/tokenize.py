"""POST /tokenize and /detokenize in vLLM's shapes, so tools written against vLLM's server work unchanged.

/tokenize takes `{"model", "prompt"}` (text, special tokens added by default) or `{"model", "messages"}` (rendered
with the chat template exactly as /v1/chat/completions would, tools included) and returns
`{"count", "max_model_len", "tokens", "token_strs"}`; /detokenize takes `{"model", "tokens"}` and returns
`{"prompt"}`. `model` may be omitted when one model is served (as in vLLM).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from gateway.errors import InvalidRequestError
from gateway.http.body_depth import NestingAwareRoute
from gateway.openai.chat_template import render_chat
from gateway.openai.protocol import ChatMessage, ToolDefinition, _Lenient
from gateway.repository.registry import LoadedLLM, ModelRegistry

MAX_TOKENS_IN = 1_000_000

router = APIRouter(route_class=NestingAwareRoute)


class TokenizeRequest(_Lenient):
    model: str | None = Field(None, min_length=1, max_length=256)
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    tools: list[ToolDefinition] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages (the template adds them)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Lenient):
    model: str | None = Field(None, min_length=1, max_length=256)
    tokens: list[int] = Field(max_length=MAX_TOKENS_IN)


def _model(request: Request, name: str | None) -> LoadedLLM:
    registry: ModelRegistry = request.app.state.registry
    if name is not None:
        return registry.llm(name)
    models = registry.llms()
    if len(models) != 1:
        raise InvalidRequestError("several language models are served: name one in 'model'", param="model")
    return registry.llm(models[0].name)  # the lookup a named key's model list applies to


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    if (body.prompt is None) == (body.messages is None):
        raise InvalidRequestError("send exactly one of prompt or messages", param="prompt")
    model = _model(request, body.model)
    tokenizer = model.scheduler.tokenizer
    if body.messages is not None:
        tools = [t.model_dump(exclude_none=True) for t in body.tools or []] or None
        parser = model.parsers.tool if tools or any(m.tool_calls for m in body.messages) else None
        tokens = await render_chat(
            tokenizer,
            body.messages,
            tools,
            parser,
            body.chat_template_kwargs,
            body.add_generation_prompt,
            model.template_support,
        )
        if body.add_special_tokens:
            tokens = await asyncio.to_thread(
                lambda: tokenizer.encode(tokenizer.decode(tokens, skip_special_tokens=False), add_special_tokens=True)
            )
    else:  # off the event loop: a prompt may be megabytes
        tokens = await asyncio.to_thread(
            tokenizer.encode, body.prompt or "", add_special_tokens=body.add_special_tokens is not False
        )
    return {
        "count": len(tokens),
        "max_model_len": model.scheduler.info.max_model_len,
        "tokens": tokens,
        "token_strs": tokenizer.convert_ids_to_tokens(tokens) if body.return_token_strs else None,
    }


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, str]:
    model = _model(request, body.model)
    vocab = model.scheduler.info.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise InvalidRequestError(f"token ids must be in [0, {vocab})", param="tokens")
    text = await asyncio.to_thread(model.scheduler.tokenizer.decode, body.tokens, skip_special_tokens=False)
    return {"prompt": text}
