"""The passthrough engine against an upstream that closes each kept-alive connection after answering without
saying so (llama.cpp's server does after a streamed answer): the next request, which the pool sends on that dead
connection, is sent again on a new one instead of failing with a 502."""

from __future__ import annotations

import asyncio
import json

import pytest

from engines.passthrough.engine import OpenAIUpstream, PassthroughSettings, build_passthrough_engine

ANSWER = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}]}


async def _closing_upstream() -> tuple[asyncio.Server, list[int]]:
    """An HTTP/1.1 server that answers one request a connection with keep-alive headers, and closes the connection
    when the next request arrives on it, unanswered. Returns the server and the requests it answered."""
    answered: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        answered.append(1)
        body = json.dumps(ANSWER).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        await writer.drain()
        await reader.read(1)  # the client pooled the connection and sends the next request on it: it dies now
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), answered


@pytest.mark.asyncio
async def test_a_connection_the_upstream_closed_is_retried_on_a_new_one() -> None:
    server, answered = await _closing_upstream()
    port = server.sockets[0].getsockname()[1]
    engine = build_passthrough_engine(PassthroughSettings(f"http://127.0.0.1:{port}/v1", "m"), max_model_len=64)
    assert isinstance(engine, OpenAIUpstream)
    await engine.start()
    try:
        for _ in range(4):
            answer = await engine.request("completions", {"model": "m", "prompt": "x"}, {})
            assert answer["choices"][0]["text"] == "hi"
    finally:
        await engine.shutdown()
        server.close()
        await server.wait_closed()
    assert len(answered) == 4  # each answered once, three of them on a second try
