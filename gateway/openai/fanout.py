"""Run one engine request per choice (prompts x n) and merge their update streams.

Each choice is pumped by its own task into one queue, so choices interleave as they are produced. Closing the
merged stream (client gone, error) cancels the pumps, which closes each engine stream and aborts its request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from engines.types import GenerationOutput, GenerationRequest, SamplingParams
from gateway.http.ids import random_hex
from gateway.keys import context as key_context
from gateway.openai.results import check_output
from gateway.scheduler.llm.interface import LLMScheduler


@dataclass
class Choice:
    index: int
    prompt_token_ids: list[int]
    sampling: SamplingParams


async def merged_stream(
    scheduler: LLMScheduler,
    choices: list[Choice],
    priority: int = 0,
    session_id: str | None = None,
    timeout: float | None = None,
) -> AsyncIterator[tuple[int, GenerationOutput]]:
    """`timeout`: each choice's longest wait for admission (None: the model's default)."""
    base = random_hex()
    priority = key_context.priority(priority)  # a named key's priority comes first
    requests = [
        GenerationRequest(
            f"{base}-{c.index}", c.prompt_token_ids, c.sampling, priority, session_id, queue_timeout=timeout
        )
        for c in choices
    ]
    if len(requests) == 1:
        async for out in scheduler.generate(requests[0]):
            yield choices[0].index, out
        return

    queue: asyncio.Queue[tuple[int, GenerationOutput] | BaseException] = asyncio.Queue()

    async def pump(choice: Choice, request: GenerationRequest) -> None:
        try:
            async for out in scheduler.generate(request):
                queue.put_nowait((choice.index, out))
        except Exception as exc:  # surfaced to the consumer, which decides the response
            queue.put_nowait(exc)

    tasks = [asyncio.create_task(pump(c, r)) for c, r in zip(choices, requests, strict=True)]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item[1].finished:
                remaining -= 1
            yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def primed(stream: AsyncIterator[tuple[int, GenerationOutput]]) -> AsyncIterator[tuple[int, GenerationOutput]]:
    """Wait for the first update before a stream's response starts.

    Failures that only show once the request reaches the scheduler (queue full, engine stopped, a failed first step)
    then surface as ordinary HTTP errors with their status and Retry-After, instead of as an error event inside a
    200 stream. Costs nothing: the first SSE chunk could not be sent before the first token anyway.
    """
    try:
        first = await anext(stream)
        check_output(first[1])
    except BaseException:
        await stream.aclose()  # type: ignore[attr-defined]
        raise

    async def chained() -> AsyncIterator[tuple[int, GenerationOutput]]:
        try:
            yield first
            async for item in stream:
                yield item
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    return chained()
