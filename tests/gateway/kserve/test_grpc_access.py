"""The access checks of the gRPC service, run inside each call: peer addresses and rate-limit buckets."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from gateway.keys.rate_limit import RateLimiter
from gateway.kserve.grpc_access import _admitted, peer_address


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:10.0.0.7:5501", "10.0.0.7"),
        ("ipv6:[::1]:5501", "::1"),
        ("ipv6:[2001:db8::2]:443", "2001:db8::2"),
        ("unix:/run/switchyard.sock", "unix:/run/switchyard.sock"),
        ("", ""),
    ],
)
def test_peer_address_drops_the_port(peer: str, address: str) -> None:
    assert peer_address(peer) == address


class Aborted(Exception):
    pass


class Context:
    def __init__(self, peer: str) -> None:
        self._peer = peer
        self.code: grpc.StatusCode | None = None

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise Aborted(details)


def test_callers_without_a_key_get_a_bucket_per_address() -> None:
    limiter = RateLimiter(requests_per_minute=1)

    async def infer(request: Any, context: Any) -> str:
        return "ok"

    async def stream(request: Any, context: Any) -> Any:
        yield "a"
        yield "b"

    unary = _admitted(grpc.unary_unary_rpc_method_handler(infer), lambda address: limiter.admit(f"ip:{address}"))
    streaming = _admitted(grpc.unary_stream_rpc_method_handler(stream), lambda address: limiter.admit(f"ip:{address}"))

    async def calls() -> None:
        assert await unary.unary_unary(None, Context("ipv4:10.0.0.1:1000")) == "ok"
        assert [r async for r in streaming.unary_stream(None, Context("ipv4:10.0.0.2:1000"))] == ["a", "b"]
        for peer, behavior in (("ipv4:10.0.0.1:2000", unary.unary_unary), ("ipv4:10.0.0.2:3000", None)):
            context = Context(peer)
            with pytest.raises(Aborted, match="requests"):
                if behavior is not None:
                    await behavior(None, context)
                else:
                    [r async for r in streaming.unary_stream(None, context)]
            assert context.code is grpc.StatusCode.RESOURCE_EXHAUSTED

    asyncio.run(calls())
