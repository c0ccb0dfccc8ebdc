"""KServe v2 over gRPC: `inference.GRPCInferenceService` on `--grpc-port`, served with grpc.aio in the app's
event loop, sharing the registry (and so the batchers) with the HTTP routes.

Tensors go through codec.py like HTTP: `raw_input_contents` or typed `contents` in, `raw_output_contents` out.
Errors are `SwitchyardError`s mapped onto gRPC status codes; ModelStreamInfer reports a failed request in
`error_message` and keeps the stream open. Decoupled models and LLMs stream several responses per request,
each flagged with the `triton_final_response` parameter (plus an empty final response when the client sets
`triton_enable_empty_final_response`, as tritonclient does for decoupled models).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format

from gateway.errors import ConfigError, SwitchyardError
from gateway.kserve.codec import (
    InputTensor,
    OutputTensor,
    TensorCodecError,
    decode_json_tensor,
    decode_raw_input_contents,
    encode_raw_output_contents,
)
from gateway.kserve.data_plane import DataPlane
from gateway.kserve.grpc_access import AccessInterceptor
from gateway.kserve.proto import kserve_inference_pb2 as pb
from gateway.kserve.proto import kserve_inference_pb2_grpc as pb_grpc
from gateway.repository.model_use import close_use, open_use
from gateway.server.access import AccessControl

log = logging.getLogger("switchyard.grpc")

_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.UNAVAILABLE,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"


def status_code(error: SwitchyardError) -> grpc.StatusCode:
    fallback = grpc.StatusCode.INTERNAL if error.status >= 500 else grpc.StatusCode.INVALID_ARGUMENT
    return _CODES.get(error.status, fallback)


def _rpc(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Unary handlers: SwitchyardError -> its status code; anything else -> INTERNAL without details."""

    @functools.wraps(method)
    async def wrapper(self: Servicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        use = open_use(_deadline(context))  # the call holds the models it uses; its deadline bounds a load's wait
        try:
            return await method(self, request, context)
        except SwitchyardError as exc:
            await context.abort(status_code(exc), exc.message)
        except TensorCodecError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("gRPC %s failed", method.__name__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal server error; see the server log")
        finally:
            close_use(use)

    return wrapper


def _deadline(context: Any) -> float | None:
    """The call's deadline on time.monotonic()'s clock, or None."""
    remaining = context.time_remaining()
    return time.monotonic() + remaining if remaining is not None else None


def read_params(params: Any) -> dict[str, Any]:
    """A protobuf map<string, InferParameter> as plain values."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        choice = value.WhichOneof("parameter_choice")
        out[key] = getattr(value, choice) if choice else None
    return out


def write_params(target: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        elif isinstance(value, float):
            target[key].double_param = value
        else:
            target[key].string_param = str(value)


def decode_inputs(request: pb.ModelInferRequest) -> list[InputTensor]:
    """The request's tensors, from raw_input_contents or typed contents."""
    specs = [
        {"name": t.name, "datatype": t.datatype, "shape": list(t.shape), "parameters": read_params(t.parameters)}
        for t in request.inputs
    ]
    if request.raw_input_contents:
        return decode_raw_input_contents(specs, list(request.raw_input_contents))
    tensors = []
    for spec, tensor in zip(specs, request.inputs, strict=True):
        field = _CONTENTS.get(tensor.datatype)
        if field is None:
            raise TensorCodecError(
                f"input '{tensor.name[:64]}': {tensor.datatype[:16]} data must be sent in raw_input_contents"
            )
        decoded = decode_json_tensor({**spec, "data": list(getattr(tensor.contents, field))})
        tensors.append(InputTensor(decoded.name, decoded.datatype, decoded.array, spec["parameters"]))
    return tensors


def build_response(
    name: str, version: str, request_id: str, outputs: list[OutputTensor], parameters: dict[str, Any] | None = None
) -> pb.ModelInferResponse:
    response = pb.ModelInferResponse(model_name=name, model_version=version, id=request_id)
    metadata, blobs = encode_raw_output_contents(outputs)
    for meta in metadata:
        response.outputs.add(name=meta["name"], datatype=meta["datatype"], shape=meta["shape"])
    response.raw_output_contents.extend(blobs)
    if parameters:
        write_params(response.parameters, parameters)
    return response


class Servicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, app: Any) -> None:
        self.app = app

    @property
    def plane(self) -> DataPlane:
        return self.app.state.kserve

    # ------------------------------------------------------------------ health and metadata

    @_rpc
    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:  # noqa: N802
        return pb.ServerLiveResponse(live=True)

    @_rpc
    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:  # noqa: N802
        return pb.ServerReadyResponse(ready=bool(self.app.state.ready))

    @_rpc
    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:  # noqa: N802
        return pb.ModelReadyResponse(ready=self.plane.model_ready(request.name, request.version))

    @_rpc
    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:  # noqa: N802
        return json_format.ParseDict(DataPlane.server_metadata(), pb.ServerMetadataResponse())

    @_rpc
    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:  # noqa: N802
        return json_format.ParseDict(
            self.plane.model_metadata(request.name, request.version), pb.ModelMetadataResponse()
        )

    @_rpc
    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:  # noqa: N802
        doc = self.plane.model_config(request.name, request.version)
        return pb.ModelConfigResponse(config=json_format.ParseDict(doc, pb.ModelConfig(), ignore_unknown_fields=True))

    @_rpc
    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:  # noqa: N802
        entries = self.plane.statistics(request.name, request.version)
        return json_format.ParseDict({"model_stats": entries}, pb.ModelStatisticsResponse())

    # ------------------------------------------------------------------ repository

    @_rpc
    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:  # noqa: N802
        rows = self.plane.repository_index(ready_only=request.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**row) for row in rows])

    @_rpc
    async def RepositoryModelLoad(self, request: Any, context: Any) -> pb.RepositoryModelLoadResponse:  # noqa: N802
        await self.plane.load(request.model_name, read_params(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: Any, context: Any) -> pb.RepositoryModelUnloadResponse:  # noqa: N802
        await self.plane.unload(request.model_name, read_params(request.parameters))
        return pb.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------------ inference

    @_rpc
    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:  # noqa: N802
        version, outputs = await self.plane.infer(
            request.model_name,
            request.model_version,
            decode_inputs(request),
            [o.name for o in request.outputs],
            read_params(request.parameters),
        )
        return build_response(request.model_name, version, request.id, outputs)

    async def ModelStreamInfer(  # noqa: N802
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests are served concurrently; their responses interleave (clients match them by `id`)."""
        queue: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def serve(request: Any) -> None:
            use = open_use(_deadline(context))
            try:
                async for response in self._stream_one(request):
                    await queue.put(pb.ModelStreamInferResponse(infer_response=response))
            except SwitchyardError as exc:
                await queue.put(pb.ModelStreamInferResponse(error_message=exc.message))
            except TensorCodecError as exc:
                await queue.put(pb.ModelStreamInferResponse(error_message=str(exc)))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gRPC stream request failed")
                await queue.put(pb.ModelStreamInferResponse(error_message="internal server error; see the server log"))
            finally:
                close_use(use)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    task = asyncio.create_task(serve(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.gather(*list(tasks), return_exceptions=True)
            finally:
                await queue.put(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await queue.get()) is not None:
                yield item
        finally:
            reader.cancel()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(reader, *tasks, return_exceptions=True)

    async def _stream_one(self, request: Any) -> AsyncIterator[pb.ModelInferResponse]:
        """One stream request's responses, each flagged final or not."""
        name = request.model_name
        params = read_params(request.parameters)
        empty_final = params.pop(EMPTY_FINAL, False) is True
        responses = self.plane.infer_stream(
            name, request.model_version, decode_inputs(request), [o.name for o in request.outputs], params
        )
        held: tuple[str, list[OutputTensor]] | None = None
        try:
            async for version, outputs in responses:
                if empty_final:
                    yield build_response(name, version, request.id, outputs, {FINAL: False})
                    continue
                if held is not None:
                    yield build_response(name, held[0], request.id, held[1], {FINAL: False})
                held = (version, outputs)
        except Exception:
            if held is not None:  # what was produced before the failure still goes out
                yield build_response(name, held[0], request.id, held[1], {FINAL: False})
            raise
        if empty_final:
            yield build_response(name, "", request.id, [], {FINAL: True})
        elif held is not None:
            yield build_response(name, held[0], request.id, held[1], {FINAL: True})


async def start_grpc_server(
    app: Any, host: str, port: int, max_message_bytes: int, access: AccessControl
) -> grpc.aio.Server:
    """Start the service on host:port (in the running event loop); ConfigError if the port cannot be bound."""
    server = grpc.aio.server(
        interceptors=[AccessInterceptor(access)],
        options=[
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max(max_message_bytes, 256 * 1024 * 1024)),
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(app), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if not bound:
        raise ConfigError(f"cannot listen for gRPC on {address}; pick another --grpc-port (0 disables gRPC).")
    await server.start()
    return server
