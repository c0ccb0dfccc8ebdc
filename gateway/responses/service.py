"""Creating, continuing, storing and cancelling responses; the chat path generates every answer.

A stored response keeps its conversation, so `previous_response_id` continues it without the client resending
anything. The turns of a conversation share one KV session (`resp-<first response id>`): the engine keeps the
conversation's KV blocks pinned between turns, and a continued response prefills only its new tokens.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from gateway.config import ServerConfig
from gateway.errors import InvalidRequestError, NotFoundError, SwitchyardError
from gateway.openai.chat import chat_completion
from gateway.repository.registry import LoadedLLM
from gateway.responses.background import BackgroundResponses
from gateway.responses.convert import (
    chat_request,
    history_messages,
    incomplete_details,
    input_messages,
    item_id,
    output_items,
    renamed,
    response_object,
    usage,
)
from gateway.responses.events import response_events
from gateway.responses.protocol import ResponsesRequest
from gateway.responses.store import ResponseStore, StoredResponse


@dataclass
class _Turn:
    """One response being made: its request, the conversation it extends and where it is kept."""

    req: ResponsesRequest
    model: LoadedLLM
    resp_id: str
    created: int
    conversation: list[dict[str, Any]]  # chat messages before this response's answer (no instructions)
    session: str | None
    owner: str  # the key that created it: only that key reads, continues or deletes it

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        chat_usage: dict[str, Any] | None = None,
        finish_reason: str | None = None,
        error: SwitchyardError | None = None,
    ) -> dict[str, Any]:
        if error is not None:
            status = "failed"
        elif status == "completed" and finish_reason == "length":
            status = "incomplete"
        return response_object(
            self.resp_id,
            self.created,
            self.req,
            self.model.name,
            status,
            output,
            usage(chat_usage),
            incomplete_details(finish_reason) if status == "incomplete" else None,
            {"code": error.code or error.type, "message": error.message} if error is not None else None,
        )


class ResponsesService:
    def __init__(self, store: ResponseStore) -> None:
        self.store = store
        self.background = BackgroundResponses()

    async def _turn(self, req: ResponsesRequest, model: LoadedLLM, owner: str) -> _Turn:
        history: list[dict[str, Any]] = []
        session = None
        resp_id = item_id("resp")
        if req.previous_response_id is not None:
            previous = await self.store.get(req.previous_response_id, owner)
            if previous is None:
                raise InvalidRequestError(
                    f"Previous response with id '{req.previous_response_id[:64]}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = previous.history
            session = previous.session if previous.model == model.name else None
        if session is None and req.store:
            session = f"resp-{resp_id}"
        return _Turn(req, model, resp_id, int(time.time()), [*history, *input_messages(req)], session, owner)

    async def _keep(self, turn: _Turn, final: dict[str, Any]) -> dict[str, Any]:
        if turn.req.store:
            history = [*turn.conversation, *history_messages(final["output"])]
            await self.store.put(StoredResponse(final, history, turn.session or "", turn.model.name, turn.owner))
        return final

    async def _chat(self, turn: _Turn) -> Any:
        try:
            chat = chat_request(turn.req, turn.conversation)
            return await chat_completion(chat, turn.model, True, turn.session)
        except SwitchyardError as exc:
            raise renamed(exc) from None

    async def _complete(self, turn: _Turn) -> dict[str, Any]:
        body = await self._chat(turn)
        choice = body["choices"][0]
        reason = choice["finish_reason"]
        final = turn.response("completed", output_items(choice["message"], reason), body["usage"], reason)
        return await self._keep(turn, final)

    async def create(
        self, req: ResponsesRequest, model: LoadedLLM, owner: str
    ) -> dict[str, Any] | AsyncIterator[dict[str, Any]]:
        """The Response object, or (when streaming) its events; `owner` is the caller's key fingerprint."""
        if req.background and not req.store:
            raise InvalidRequestError("background responses must be stored: set store to true", param="background")
        turn = await self._turn(req, model, owner)
        if req.background and not req.stream:
            try:
                chat_request(req, turn.conversation)  # refuse a bad request now, not in the background
            except SwitchyardError as exc:
                raise renamed(exc) from None
            return self._start_background(turn)
        if not req.stream:
            return await self._complete(turn)
        chunks = await self._chat(turn)  # primed: failures before the first token are HTTP errors

        async def finish(
            output: list[dict[str, Any]],
            chat_usage: dict[str, Any] | None,
            reason: str | None,
            error: SwitchyardError | None,
        ) -> dict[str, Any]:
            final = turn.response("completed", output, chat_usage, reason, error)
            # a failed background response is kept (its client polls for it); a failed stream is not
            return await self._keep(turn, final) if error is None or req.background else final

        start = turn.response("in_progress", [])
        events = response_events(chunks, start, finish)
        if not req.background:
            return events
        self.background.start_stream(dict(start), owner, self._cancellable(turn, events))
        return await self.background.follow(turn.resp_id, owner)

    async def _cancellable(self, turn: _Turn, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """A background stream's events; cancelling it stores the response as cancelled."""
        try:
            async for event in events:
                yield event
        except asyncio.CancelledError:
            await self._keep(turn, turn.response("cancelled", []))
            raise

    def _start_background(self, turn: _Turn) -> dict[str, Any]:
        queued = turn.response("queued", [])

        async def work() -> None:
            try:
                final = await self._complete(turn)
            except asyncio.CancelledError:
                await self._keep(turn, turn.response("cancelled", []))
                raise
            except SwitchyardError as exc:
                await self._keep(turn, turn.response("failed", [], error=exc))
                return
            queued.update(final)

        self.background.start(queued, turn.owner, work)
        return dict(queued)

    async def follow(self, resp_id: str, owner: str, starting_after: int) -> AsyncIterator[dict[str, Any]]:
        """The events of a running streamed background response after `starting_after`."""
        return await self.background.follow(resp_id, owner, starting_after)

    async def get(self, resp_id: str, owner: str) -> dict[str, Any]:
        running = self.background.get(resp_id, owner)
        if running is not None:
            return dict(running)
        stored = await self.store.get(resp_id, owner)
        if stored is None:
            raise NotFoundError(f"Response with id '{resp_id[:64]}' not found.", param="response_id")
        return stored.response

    async def delete(self, resp_id: str, owner: str) -> dict[str, Any]:
        await self.background.cancel(resp_id, owner)
        if not await self.store.delete(resp_id, owner):
            raise NotFoundError(f"Response with id '{resp_id[:64]}' not found.", param="response_id")
        return {"id": resp_id, "object": "response.deleted", "deleted": True}

    async def cancel(self, resp_id: str, owner: str) -> dict[str, Any]:
        if await self.background.cancel(resp_id, owner):
            return await self.get(resp_id, owner)
        response = await self.get(resp_id, owner)
        if not response.get("background"):
            raise InvalidRequestError("Only background responses can be cancelled.", param="response_id")
        return response  # it already ended: cancelling is a no-op, as on OpenAI

    async def close(self) -> None:
        await self.background.close()
        self.store.close()


def open_service(config: ServerConfig) -> ResponsesService:
    """The service over its store: `responses_store`, or responses.sqlite3 in the cache directory."""
    path = config.responses_store or config.cache_dir / "responses.sqlite3"
    store = ResponseStore(path, config.responses_max_stored, config.responses_ttl_secs, config.responses_max_bytes)
    return ResponsesService(store)
