"""Clients that go away stop their generation: slots and KV blocks are freed within a step or two."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.conftest import DEFAULT_MODEL, ServerProcess

LONG = {"model": DEFAULT_MODEL, "prompt": "Tell me a very long story.", "max_tokens": 2000, "ignore_eos": True}


async def test_streams_cut_after_half_a_second_are_aborted(server: ServerProcess) -> None:
    async def cut(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as resp:
            assert resp.status_code == 200
            try:
                async with asyncio.timeout(0.5):
                    async for _ in resp.aiter_bytes():
                        pass
            except TimeoutError:
                pass

    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        await asyncio.gather(*(cut(client) for _ in range(20)))
    assert server.wait_idle() == (0, 0, 0)
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        r = await client.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 4})
    assert r.status_code == 200 and time.monotonic() - started < 30


async def test_non_streaming_client_gone_is_aborted(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=0.5) as client:
        for _ in range(3):
            try:
                await client.post("/v1/completions", json=LONG)
            except httpx.TimeoutException:
                pass
    assert server.wait_idle() == (0, 0, 0)
