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
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format

from gateway import __version__
from gateway.access import AccessControl
from gateway.errors import ConfigError, InvalidRequestError, NotFoundError, SwitchyardError
from gateway.kserve import llm_bridge
from gateway.kserve.codec import (
    InputTensor,
    OutputTensor,
    TensorCodecError,
    decode_json_tensor,
    decode_raw_input_contents,
    encode_raw_output_contents,
)
from gateway.kserve.grpc_access import AccessInterceptor
from gateway.kserve.http import EXTENSIONS
from gateway.kserve.proto import kserve_inference_pb2 as pb
from gateway.kserve.proto import kserve_inference_pb2_grpc as pb_grpc
from gateway.repository.registry import LoadedModel, ModelRegistry

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
}
_CONTENTS = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
FINAL = "triton_final_response"
EMPTY_FINAL = "triton_enable_empty_final_response"


def status_code(error: SwitchyardError) -> grpc.StatusCode:
    return _CODES.get(
        error.status, grpc.StatusCode.INTERNAL if error.status >= 500 else grpc.StatusCode.INVALID_ARGUMENT
    )


def _rpc(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Unary handlers: SwitchyardError -> its status code; anything else -> INTERNAL without details."""

    @functools.wraps(method)
    async def wrapper(self: Servicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
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

    return wrapper


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
    specs = [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape), "parameters": read_params(t.parameters)}
             for t in request.inputs]
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


def build_response(name: str, version: str, request_id: str, outputs: list[OutputTensor],
                   parameters: dict[str, Any] | None = None) -> pb.ModelInferResponse:
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
    def registry(self) -> ModelRegistry:
        return self.app.state.registry

    # ------------------------------------------------------------------ health and metadata

    @_rpc
    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:  # noqa: N802
        return pb.ServerLiveResponse(live=True)

    @_rpc
    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:  # noqa: N802
        return pb.ServerReadyResponse(ready=bool(self.app.state.ready))

    @_rpc
    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:  # noqa: N802
        try:
            model = self.registry.get(request.name)
            _check_version(model, request.version)
        except NotFoundError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    @_rpc
    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:  # noqa: N802
        return pb.ServerMetadataResponse(name="switchyard", version=__version__, extensions=EXTENSIONS)

    @_rpc
    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:  # noqa: N802
        model = self.registry.get(request.name)
        if model.tensor is not None:
            doc = model.tensor.metadata(request.version or None)
        else:
            _check_version(model, request.version)
            doc = llm_bridge.llm_metadata(model)
        return json_format.ParseDict(doc, pb.ModelMetadataResponse())

    @_rpc
    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:  # noqa: N802
        model = self.registry.get(request.name)
        if model.tensor is not None:
            doc = model.tensor.config_json(request.version or None)
        else:
            _check_version(model, request.version)
            doc = llm_bridge.llm_config(model)
        return pb.ModelConfigResponse(config=json_format.ParseDict(doc, pb.ModelConfig(), ignore_unknown_fields=True))

    @_rpc
    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:  # noqa: N802
        from gateway.kserve.http import _stats

        if request.name:
            entries = _stats(self.registry.get(request.name), request.version or None)
        else:
            entries = [s for m in self.registry.all_models() for s in _stats(m, None)]
        return json_format.ParseDict({"model_stats": entries}, pb.ModelStatisticsResponse())

    # ------------------------------------------------------------------ repository

    @_rpc
    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:  # noqa: N802
        rows = self.registry.index(ready_only=request.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**row) for row in rows])

    @_rpc
    async def RepositoryModelLoad(self, request: Any, context: Any) -> pb.RepositoryModelLoadResponse:  # noqa: N802
        params = {}
        for key, value in request.parameters.items():
            params[key] = getattr(value, value.WhichOneof("parameter_choice") or "string_param")
        if any(k.startswith("file:") for k in params):
            raise InvalidRequestError(
                "model files cannot be sent over the network ('file:' parameters are not supported)"
            )
        unknown = [k for k in params if k != "config"]
        if unknown:
            raise InvalidRequestError(f"unknown load parameter '{unknown[0][:64]}'; only 'config' is supported")
        override = None
        if "config" in params:
            try:
                override = json.loads(params["config"])
            except (TypeError, ValueError):
                raise InvalidRequestError("parameter 'config' must be a JSON object") from None
            if not isinstance(override, dict):
                raise InvalidRequestError("parameter 'config' must be a JSON object")
        await self.registry.load(request.model_name, override)
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request: Any, context: Any) -> pb.RepositoryModelUnloadResponse:  # noqa: N802
        await self.registry.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------------ inference

    @_rpc
    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:  # noqa: N802
        model = self.registry.get(request.model_name)
        inputs = decode_inputs(request)
        params = read_params(request.parameters)
        wanted = [o.name for o in request.outputs]
        if model.tensor is not None:
            entry, outputs = await model.tensor.infer(inputs, wanted, request.model_version or None, params)
            return build_response(model.name, str(entry.version), request.id, outputs)
        _check_version(model, request.model_version)
        prompt, values, _stream = llm_bridge.infer_values(inputs, params)
        text = "".join([d async for d in llm_bridge.generate_text(model, prompt, values)])
        outputs = [OutputTensor(llm_bridge.TEXT_OUTPUT, llm_bridge.text_tensor(text), "BYTES")]
        return build_response(model.name, "1", request.id, outputs)

    async def ModelStreamInfer(  # noqa: N802
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests are served concurrently; their responses interleave (clients match them by `id`)."""
        queue: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def serve(request: Any) -> None:
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
        model = self.registry.get(request.model_name)
        inputs = decode_inputs(request)
        params = read_params(request.parameters)
        empty_final = params.pop(EMPTY_FINAL, False) is True
        wanted = [o.name for o in request.outputs]

        async def responses() -> AsyncIterator[tuple[str, list[OutputTensor]]]:
            if model.tensor is not None:
                async for entry, outputs in model.tensor.infer_stream(
                    inputs, wanted, request.model_version or None, params
                ):
                    yield str(entry.version), outputs
                return
            _check_version(model, request.model_version)
            prompt, values, stream = llm_bridge.infer_values(inputs, params)
            deltas = llm_bridge.generate_text(model, prompt, values)
            if stream:
                async for delta in deltas:
                    yield "1", [OutputTensor(llm_bridge.TEXT_OUTPUT, llm_bridge.text_tensor(delta), "BYTES")]
            else:
                text = "".join([d async for d in deltas])
                yield "1", [OutputTensor(llm_bridge.TEXT_OUTPUT, llm_bridge.text_tensor(text), "BYTES")]

        held: tuple[str, list[OutputTensor]] | None = None
        try:
            async for version, outputs in responses():
                if empty_final:
                    yield build_response(model.name, version, request.id, outputs, {FINAL: False})
                    continue
                if held is not None:
                    yield build_response(model.name, held[0], request.id, held[1], {FINAL: False})
                held = (version, outputs)
        except Exception:
            if held is not None:  # what was produced before the failure still goes out
                yield build_response(model.name, held[0], request.id, held[1], {FINAL: False})
            raise
        if empty_final:
            yield build_response(model.name, "", request.id, [], {FINAL: True})
        elif held is not None:
            yield build_response(model.name, held[0], request.id, held[1], {FINAL: True})


def _check_version(model: LoadedModel, version: str) -> None:
    if model.tensor is not None:
        model.tensor.version(version or None)
    elif version not in ("", "1"):
        raise NotFoundError(f"model '{model.name}' has no version '{version[:40]}'")


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
        ]
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
