"""KServe v2's operations, once for both transports: server and model metadata, readiness, config, infer (one
answer or a stream of them), statistics and the repository API (index, load, unload).

`http.py` and `grpc.py` are codecs around this: they turn their wire format into the plain values taken here
(names, versions, `InputTensor`s, parameter mappings) and the answers back. Tensor models are served by their
runtime (`gateway/tensor/`), LLMs through `llm_bridge.py` (text tensors in and out), the repository API by model
control. As KServe's own server keeps one `DataPlane` under its REST and gRPC servers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from gateway import __version__
from gateway.errors import InvalidRequestError, NotFoundError
from gateway.keys import context as key_context
from gateway.kserve import llm_bridge
from gateway.repository.lifecycle_config import parse_duration
from gateway.repository.loaded_model import LoadedLLM, LoadedModel, LoadedTensorModel
from gateway.repository.model_control import ModelControl
from gateway.repository.registry import ModelRegistry
from gateway.tensor.tensors import InputTensor, OutputTensor

EXTENSIONS = [
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "schedule_policy",
    "statistics",
    "generate",
    "sequence",
]
#: A version as a request names it: None or '' for the latest.
Version = str | None


class DataPlane:
    """The v2 answers over the registry (which model answers a name) and model control (load, unload, states)."""

    def __init__(self, models: ModelRegistry, control: ModelControl) -> None:
        self.models = models
        self.control = control

    # ------------------------------------------------------------------ metadata

    @staticmethod
    def server_metadata() -> dict[str, Any]:
        return {"name": "switchyard", "version": __version__, "extensions": EXTENSIONS}

    def model(self, name: str, version: Version = None) -> LoadedModel:
        """The model serving `name`, with `version` served; 404 otherwise."""
        model = self.models.get(name)
        model.version_number(version or None)
        return model

    async def serving(self, name: str, version: Version = None) -> LoadedModel:
        """`model` for an inference request: a model that loads on request is loaded first (the request waits)."""
        model = await self.models.acquire(name)
        model.version_number(version or None)
        return model

    def model_ready(self, name: str, version: Version = None) -> bool:
        try:
            self.model(name, version)
        except NotFoundError:
            return False
        return True

    def model_metadata(self, name: str, version: Version = None) -> dict[str, Any]:
        model = self.model(name, version)
        if isinstance(model, LoadedTensorModel):
            return model.tensor.metadata(version or None)
        assert isinstance(model, LoadedLLM)
        return llm_bridge.llm_metadata(model)

    def model_config(self, name: str, version: Version = None) -> dict[str, Any]:
        model = self.model(name, version)
        if isinstance(model, LoadedTensorModel):
            return model.tensor.config_json(version or None)
        assert isinstance(model, LoadedLLM)
        return llm_bridge.llm_config(model)

    def statistics(self, name: str = "", version: Version = None) -> list[dict[str, Any]]:
        """Triton's model statistics: one entry per served version of `name`, or of every model when unnamed."""
        if not name:
            return [
                s.as_dict(m.name, str(n))
                for m in self.models.all_models()
                if key_context.visible(m.name)
                for n, s, _ in m.version_stats()
            ]
        model = self.models.get(name)
        chosen = model.version_number(version) if version else None
        return [s.as_dict(model.name, str(n)) for n, s, _ in model.version_stats() if chosen in (None, n)]

    # ------------------------------------------------------------------ inference

    async def infer(
        self,
        name: str,
        version: Version,
        inputs: Sequence[InputTensor],
        wanted: Sequence[str],
        parameters: Mapping[str, Any],
    ) -> tuple[str, list[OutputTensor]]:
        """One request, one answer: the version that served it and its outputs."""
        model = await self.serving(name, version)
        if isinstance(model, LoadedTensorModel):
            entry, outputs = await model.tensor.infer(inputs, wanted, version or None, dict(parameters))
            return str(entry.version), outputs
        assert isinstance(model, LoadedLLM)
        prompt, values, _stream = self._llm_request(model, inputs, wanted, parameters)
        text = "".join([d async for d in llm_bridge.generate_text(model, prompt, values)])
        return "1", [_text_output(text)]

    async def infer_stream(
        self,
        name: str,
        version: Version,
        inputs: Sequence[InputTensor],
        wanted: Sequence[str],
        parameters: Mapping[str, Any],
    ) -> AsyncIterator[tuple[str, list[OutputTensor]]]:
        """One request, its answers as they come: several for a decoupled model or an LLM asked to `stream`."""
        model = await self.serving(name, version)
        if isinstance(model, LoadedTensorModel):
            async for entry, outputs in model.tensor.infer_stream(inputs, wanted, version or None, dict(parameters)):
                yield str(entry.version), outputs
            return
        assert isinstance(model, LoadedLLM)
        prompt, values, stream = self._llm_request(model, inputs, wanted, parameters)
        deltas = llm_bridge.generate_text(model, prompt, values)
        if stream:
            async for delta in deltas:
                yield "1", [_text_output(delta)]
        else:
            yield "1", [_text_output("".join([d async for d in deltas]))]

    @staticmethod
    def _llm_request(
        model: LoadedLLM, inputs: Sequence[InputTensor], wanted: Sequence[str], parameters: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any], bool]:
        prompt, values, stream = llm_bridge.infer_values(inputs, parameters)
        if wanted and list(wanted) != [llm_bridge.TEXT_OUTPUT]:
            raise InvalidRequestError(f"model '{model.name}' has only the output '{llm_bridge.TEXT_OUTPUT}'")
        return prompt, values, stream

    # ------------------------------------------------------------------ repository

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        return [
            entry for entry in self.control.states.index(ready_only=ready_only) if key_context.visible(entry["name"])
        ]

    async def load(self, name: str, parameters: Mapping[str, Any]) -> None:
        """Load or reload a model; parameters: `config`, a JSON object (or its text) that overrides the model's
        config file for this load, and `keep_alive` (seconds or a duration such as "10m"; -1 pins the model)."""
        if any(k.startswith("file:") for k in parameters):
            raise InvalidRequestError(
                "model files cannot be sent over the network ('file:' parameters are not supported)"
            )
        unknown = [k for k in parameters if k not in ("config", "keep_alive")]
        if unknown:
            raise InvalidRequestError(f"unknown load parameter '{unknown[0][:64]}'; use 'config' or 'keep_alive'")
        keep_alive = None
        if "keep_alive" in parameters:
            try:
                keep_alive = parse_duration(parameters["keep_alive"])
            except ValueError as exc:
                raise InvalidRequestError(f"parameter 'keep_alive': {exc}") from None
        override = None
        if "config" in parameters:
            raw = parameters["config"]
            try:
                override = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
            except ValueError:
                override = None
            if not isinstance(override, dict):
                raise InvalidRequestError("parameter 'config' must be a JSON object (or its text)")
        await self.control.load(name, override, keep_alive)

    async def unload(self, name: str, parameters: Mapping[str, Any]) -> None:
        unknown = [k for k in parameters if k != "unload_dependents"]
        if unknown:
            raise InvalidRequestError(f"unknown unload parameter '{unknown[0][:64]}'")
        await self.control.unload(name)


def _text_output(text: str) -> OutputTensor:
    return OutputTensor(llm_bridge.TEXT_OUTPUT, llm_bridge.text_tensor(text), "BYTES")
