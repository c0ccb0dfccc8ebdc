"""The HTTP access checks on the gRPC service: the same `AccessControl` (drain, API keys, rate limits), with the
key read from the `authorization` metadata.

Health RPCs are public, the repository RPCs need the admin key, everything else an API key (when keys are
configured). A refused call ends with UNAUTHENTICATED, PERMISSION_DENIED or UNAVAILABLE before the servicer runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from gateway.access import AccessControl
from gateway.errors import SwitchyardError

_STATUS = {
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


def _refusal(handler: grpc.RpcMethodHandler, error: SwitchyardError) -> grpc.RpcMethodHandler:
    code = _STATUS.get(error.status, grpc.StatusCode.INVALID_ARGUMENT)

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, error.message)

    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **kwargs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **kwargs)
    return grpc.unary_unary_rpc_method_handler(refuse, **kwargs)


# The call details do not carry the peer, so callers without a key share one rate-limit bucket on gRPC.
ANONYMOUS_GRPC_CALLER = "grpc"


class AccessInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, access: AccessControl) -> None:
        self.access = access

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        metadata = dict(details.invocation_metadata or ())
        try:
            self.access.admit(self.access.keys.grpc_role(details.method), metadata.get("authorization"),
                              ANONYMOUS_GRPC_CALLER)
        except SwitchyardError as error:
            return _refusal(handler, error)
        return handler
