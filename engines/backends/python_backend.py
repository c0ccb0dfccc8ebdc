"""The `python` backend: a model written as a Python class, in the spirit of Triton's Python backend.

A model folder holds `config.yaml` or `config.pbtxt` (with `backend: python`) and `<version>/model.py`
(or the file named by `default_model_filename`) defining::

    class TritonPythonModel:
        def initialize(self, args: dict) -> None:          # optional; called once per instance
            ...
        def execute(self, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
            ...
        def finalize(self) -> None:                        # optional; called once at unload
            ...

`args` holds `model_name`, `model_version` (string), `model_repository` (the model's folder), `version_dir`,
`model_config` (the configuration as a JSON string, Triton's field names, as in Triton), `config` (the same as a
dict), `parameters` (the config's `parameters`, name -> string), `model_instance_name`, `model_instance_kind`
("CPU") and `model_instance_device_id` ("0").

`execute` receives a batch of requests. Each request is a plain dict of input name -> numpy array: numeric
tensors have their datatype's numpy dtype, BYTES tensors are object arrays of `bytes`, and an `optional` input a
client did not send is absent. With `max_batch_size > 0` every array has a leading batch dimension (the request's
own batch size; the dynamic batcher hands several requests to one call, it does not concatenate them). Control
tensors and implicit state of sequence models arrive as ordinary inputs.

It returns one entry per request, in order: a dict of output name -> numpy array (outputs not returned are simply
absent from the response; str items in a BYTES output are encoded as UTF-8), or an `Exception` instance, which
fails that request alone with the exception's message (sent to the client: keep it free of secrets). Raising
fails every request of the batch with a generic 500; the traceback goes to the server log only.

Decoupled models (`model_transaction_policy { decoupled: true }`) return, per request, an iterable of such dicts
-- typically a generator -- each dict being one response streamed to the client (gRPC ModelStreamInfer, HTTP
generate_stream). Each instance runs on its own worker thread, so `execute` of one instance is never called
concurrently with itself; `instance_group.count` instances run in parallel.

Triton's own `triton_python_backend_utils` (pb_utils) API is not provided: a model.py importing it fails to load
with a message saying so.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from engines.backends.batching import model_file
from engines.interface import TensorBackend
from engines.types import TensorModelSpec

_TRITON_UTILS = "triton_python_backend_utils"


class PythonBackend(TensorBackend):
    def __init__(self) -> None:
        self._model: Any = None
        self._module_name = ""

    def load(self, spec: TensorModelSpec) -> None:
        path = Path(model_file(spec, "model.py"))
        self._module_name = f"switchyard_model_{spec.name.replace('-', '_').replace('.', '_')}_{uuid.uuid4().hex[:8]}"
        module_spec = importlib.util.spec_from_file_location(self._module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"'{spec.name}/{spec.version}/{path.name}' is not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[self._module_name] = module
        try:
            module_spec.loader.exec_module(module)
        except ModuleNotFoundError as exc:
            sys.modules.pop(self._module_name, None)
            if exc.name == _TRITON_UTILS:
                raise ValueError(
                    f"'{spec.name}/{spec.version}/{path.name}' imports Triton's {_TRITON_UTILS} (pb_utils), which "
                    "Switchyard does not provide; rewrite execute() with plain dicts of numpy arrays as documented "
                    "in engines/backends/python_backend.py"
                ) from None
            raise ValueError(
                f"'{spec.name}/{spec.version}/{path.name}' needs the module '{exc.name}'; install it"
            ) from None
        cls = getattr(module, "TritonPythonModel", None)
        if not isinstance(cls, type) or not callable(getattr(cls, "execute", None)):
            sys.modules.pop(self._module_name, None)
            raise ValueError(
                f"'{spec.name}/{spec.version}/{path.name}' must define class TritonPythonModel with execute()"
            )
        self._model = cls()
        initialize = getattr(self._model, "initialize", None)
        if callable(initialize):
            initialize(
                {
                    "model_name": spec.name,
                    "model_version": str(spec.version),
                    "model_repository": spec.model_dir,
                    "version_dir": spec.version_dir,
                    "model_config": json.dumps(spec.config),
                    "config": spec.config,
                    "parameters": dict(spec.parameters),
                    "model_instance_name": f"{spec.name}_{spec.instance_index}",
                    "model_instance_kind": "CPU",
                    "model_instance_device_id": "0",
                }
            )

    def execute(self, requests: list[dict[str, Any]]) -> list[Any]:
        responses = self._model.execute(requests)
        if responses is None or not hasattr(responses, "__len__") or len(responses) != len(requests):
            got = (
                "None"
                if responses is None
                else (len(responses) if hasattr(responses, "__len__") else type(responses).__name__)
            )
            raise RuntimeError(f"TritonPythonModel.execute returned {got} responses for {len(requests)} requests")
        return list(responses)

    def unload(self) -> None:
        finalize = getattr(self._model, "finalize", None)
        try:
            if callable(finalize):
                finalize()
        finally:
            self._model = None
            sys.modules.pop(self._module_name, None)
