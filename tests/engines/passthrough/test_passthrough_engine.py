"""The passthrough engine against upstreams that behave as llama.cpp's server can: one closes each kept-alive
connection after answering without saying so, one resets it while the next request is written (that request,
which the pool sends on the dead connection, is sent again on a new one instead of failing with a 502); one
leaves Nagle's algorithm on (a stream's first chunk must not wait for a delayed ACK)."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import struct
import time

import pytest

from engines.passthrough.engine import OpenAIUpstream, PassthroughSettings, build_passthrough_engine

ANSWER = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}]}


async def _answer_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read one request and answer it with ANSWER, keeping the connection alive."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
    await reader.readexactly(length)
    body = json.dumps(ANSWER).encode()
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()


async def _closing_upstream() -> tuple[asyncio.Server, list[int]]:
    """An HTTP/1.1 server that answers one request a connection with keep-alive headers, and closes the connection
    when the next request arrives on it, unanswered. Returns the server and the requests it answered."""
    answered: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _answer_one(reader, writer)
        answered.append(1)
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


async def _resetting_upstream() -> tuple[asyncio.Server, list[int]]:
    """An upstream that answers the first request of a connection and resets the connection (RST: closed with the
    rest of the next request unread) once the next request's head arrives on it, so the client fails while still
    writing that request's body. Returns the server and the requests it answered."""
    answered: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _answer_one(reader, writer)
        answered.append(1)
        await reader.readuntil(b"\r\n\r\n")  # the next request's head; its body is still coming
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        writer.transport.abort()

    return await asyncio.start_server(handle, "127.0.0.1", 0), answered


@pytest.mark.asyncio
async def test_a_connection_reset_while_the_request_is_written_is_retried_on_a_new_one() -> None:
    """What llama.cpp's server did under the passthrough bench at c=8: the pooled connection failed while the
    gateway wrote the request (aiohttp's ClientOSError: a reset, or "Can not write request body"), which was
    answered 502 before the fix."""
    server, answered = await _resetting_upstream()
    port = server.sockets[0].getsockname()[1]
    engine = build_passthrough_engine(PassthroughSettings(f"http://127.0.0.1:{port}/v1", "m"), max_model_len=64)
    await engine.start()
    prompt = "x" * (8 << 20)  # larger than the socket buffers: the body is still being written when the reset comes
    try:
        for _ in range(3):
            answer = await engine.request("completions", {"model": "m", "prompt": prompt}, {})
            assert answer["choices"][0]["text"] == "hi"
    finally:
        await engine.shutdown()
        server.close()
        await server.wait_closed()
    assert len(answered) == 3


async def _nagle_upstream() -> asyncio.Server:
    """An upstream that writes as llama.cpp's server does (cpp-httplib): Nagle's algorithm on, a stream's status
    and headers in one send once its first token is ready, then each chunk in a send of its own, connections kept
    alive. Each send after the first waits until the one before it is acknowledged."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        while head := await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b"":
            length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for data in (b'data: {"choices": [{"index": 0, "text": "hi"}]}\n\n', b"data: [DONE]\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")
@pytest.mark.asyncio
async def test_a_stream_on_a_kept_alive_connection_gets_its_first_chunk_without_a_delayed_ack() -> None:
    """Without quick ACKs the gateway's kernel holds the ACK of the headers (it has just sent a request on the
    connection and expects to answer), and the upstream's first chunk waits for it: 40 ms a request."""
    server = await _nagle_upstream()
    port = server.sockets[0].getsockname()[1]
    engine = build_passthrough_engine(PassthroughSettings(f"http://127.0.0.1:{port}/v1", "m"), max_model_len=64)
    await engine.start()
    waits = []
    try:
        for _ in range(7):  # the first on a new connection, the others on the same kept-alive one
            start = time.perf_counter()
            chunks = engine.stream("completions", {"model": "m", "prompt": "x", "stream": True}, {})
            first = await anext(chunks)
            waits.append(time.perf_counter() - start)
            assert first["choices"][0]["text"] == "hi" and [c async for c in chunks] == []
    finally:
        await engine.shutdown()
        server.close()
        await server.wait_closed()
    assert statistics.median(waits[1:]) < 0.02, [f"{w * 1000:.1f} ms" for w in waits]
