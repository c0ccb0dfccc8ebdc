"""The `onnxruntime` backend (Triton platform `onnxruntime_onnx`): `<version>/model.onnx` run with onnxruntime's
CPU provider, one session per instance, one `run` per batch.

A config may omit `input`/`output`: they are filled in from the ONNX graph (Triton's auto-complete), dropping the
leading dimension when `max_batch_size > 0`. Parameters (Triton's names): `intra_op_thread_count`,
`inter_op_thread_count`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engines.backends.batching import concat_requests, model_file, split_outputs
from engines.interface import TensorBackend
from engines.types import TensorModelSpec, TensorSpec

_ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


class OnnxRuntimeBackend(TensorBackend):
    def __init__(self) -> None:
        self._session: Any = None
        self._spec: TensorModelSpec | None = None
        self._described: dict[str, Any] = {}

    def load(self, spec: TensorModelSpec) -> None:
        import onnxruntime as ort

        path = model_file(spec, "model.onnx")
        options = ort.SessionOptions()
        for param, attr in (
            ("intra_op_thread_count", "intra_op_num_threads"),
            ("inter_op_thread_count", "inter_op_num_threads"),
        ):
            if param in spec.parameters:
                setattr(options, attr, int(spec.parameters[param]))
        try:
            self._session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ValueError(f"'{spec.name}/{spec.version}' is not a valid ONNX model: {str(exc)[:200]}") from None
        self._spec = spec
        skip = 1 if spec.max_batch_size > 0 else 0
        self._described = {
            "inputs": [self._describe(i, skip) for i in self._session.get_inputs()],
            "outputs": [self._describe(o, skip) for o in self._session.get_outputs()],
        }

    @staticmethod
    def _describe(node: Any, skip: int) -> TensorSpec:
        dims = [d if isinstance(d, int) and d > 0 else -1 for d in node.shape[skip:]]
        datatype = _ORT_TYPES.get(node.type)
        if datatype is None:
            raise ValueError(f"ONNX tensor '{node.name}' has type {node.type}, which Switchyard cannot serve")
        return TensorSpec(node.name, datatype, dims)

    def describe(self) -> dict[str, Any]:
        return self._described

    def execute(self, requests: list[dict[str, Any]]) -> list[Any]:
        assert self._spec is not None
        batch, sizes = concat_requests(self._spec, requests)
        feed = {}
        for name, array in batch.items():
            if array.dtype == object:
                array = np.vectorize(
                    lambda b: b.decode("utf-8", "replace") if isinstance(b, bytes) else b, otypes=[object]
                )(array)
            feed[name] = array
        names = [o.name for o in self._spec.outputs] or [o.name for o in self._session.get_outputs()]
        results = self._session.run(names, feed)
        return split_outputs(self._spec, dict(zip(names, results, strict=True)), sizes)

    def unload(self) -> None:
        self._session = None
