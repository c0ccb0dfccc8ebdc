"""The `tensorflow` backend (Triton platform `tensorflow_savedmodel`): a SavedModel folder
`<version>/model.savedmodel/` (or the folder `default_model_filename` names) run through one of its signatures,
one loaded copy per instance, one signature call per batch (`pip install 'switchyard[tensorflow]'`).

The signature's inputs and outputs are the model's v2 tensors, by their signature names (the keys of the
signature's input and output dicts). A config may omit `input`/`output`: they are filled in from the signature
(Triton's auto-complete) with its dtypes and shapes, the first dimension dropped when `max_batch_size > 0` (it must
then be variable, `None`, in the signature: requests are concatenated on it by the dynamic batcher). A config that
omits `max_batch_size` gets Triton's default of 4 and the dynamic batcher when every signature tensor starts with a
variable dimension, and 0 otherwise. Tensors a
config does declare must exist in the signature with the same dtype.

Parameters (Triton's names): `TF_SIGNATURE_DEF` (default `serving_default`), `TF_GRAPH_TAG` (default `serve`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.backends.batching import concat_requests, split_outputs
from engines.interface import TensorBackend
from engines.types import TensorModelSpec, TensorSpec

#: tf.DType name -> KServe wire datatype.
_TF_TYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "bfloat16": "BF16",
    "string": "BYTES",
}


def _saved_model_dir(spec: TensorModelSpec) -> Path:
    name = spec.default_model_filename or "model.savedmodel"
    version_dir = Path(spec.version_dir).resolve()
    path = (version_dir / name).resolve()
    if version_dir not in path.parents:
        raise ValueError(f"default_model_filename {name!r} must name a folder inside the version folder")
    if not (path / "saved_model.pb").is_file():
        raise ValueError(
            f"'{spec.name}/{spec.version}/{name}/saved_model.pb' is missing; put the SavedModel folder "
            f"(tf.saved_model.save) at {spec.name}/{spec.version}/{name}/"
        )
    return path


class SavedModelBackend(TensorBackend):
    def __init__(self) -> None:
        self._loaded: Any = None
        self._function: Any = None
        self._spec: TensorModelSpec | None = None
        self._inputs: dict[str, TensorSpec] = {}
        self._outputs: list[TensorSpec] = []

    def load(self, spec: TensorModelSpec) -> None:
        import tensorflow as tf

        path = _saved_model_dir(spec)
        tag = spec.parameters.get("TF_GRAPH_TAG", "serve")
        signature = spec.parameters.get("TF_SIGNATURE_DEF", "serving_default")
        try:
            self._loaded = tf.saved_model.load(str(path), tags=[tag])
        except Exception as exc:  # TensorFlow raises many types for a bad folder
            raise ValueError(
                f"'{spec.name}/{spec.version}' is not a SavedModel TensorFlow can load with tag "
                f"{tag!r}: {str(exc)[:200]}"
            ) from None
        signatures = dict(self._loaded.signatures)
        if signature not in signatures:
            raise ValueError(
                f"the SavedModel has no signature {signature!r} (it has "
                f"{', '.join(signatures) or 'none'}); set parameter TF_SIGNATURE_DEF to one of them"
            )
        self._function = signatures[signature]
        args, kwargs = self._function.structured_input_signature
        if args:
            raise ValueError(f"signature {signature!r} takes positional inputs; export it with named inputs")
        outputs = self._function.structured_outputs
        if not isinstance(outputs, dict):
            raise ValueError(f"signature {signature!r} must return a dict of named outputs")
        batched = spec.max_batch_size > 0
        found_in = {name: self._describe(name, t, batched, "input") for name, t in kwargs.items()}
        found_out = {name: self._describe(name, t, batched, "output") for name, t in outputs.items()}
        for kind, declared, found in (("input", spec.inputs, found_in), ("output", spec.outputs, found_out)):
            for tensor in declared:
                match = found.get(tensor.name)
                if match is None:
                    raise ValueError(
                        f"{kind} '{tensor.name}' is not in signature {signature!r} (its {kind}s: {', '.join(found)})"
                    )
                if match.datatype != tensor.datatype:
                    raise ValueError(
                        f"{kind} '{tensor.name}' is {tensor.datatype} in the config but "
                        f"{match.datatype} in the SavedModel"
                    )
        self._inputs = found_in
        self._outputs = [found_out[t.name] for t in spec.outputs] if spec.outputs else list(found_out.values())
        self._spec = spec

    def batch_dimension(self, spec: TensorModelSpec) -> bool:
        """Whether every tensor of the signature starts with a variable dimension, read from saved_model.pb alone."""
        from tensorflow.core.protobuf import saved_model_pb2

        path = _saved_model_dir(spec)
        tag = spec.parameters.get("TF_GRAPH_TAG", "serve")
        signature = spec.parameters.get("TF_SIGNATURE_DEF", "serving_default")
        saved = saved_model_pb2.SavedModel()
        try:
            saved.ParseFromString((path / "saved_model.pb").read_bytes())
        except Exception:  # a bad file is reported by load() with the fix
            return False
        for graph in saved.meta_graphs:
            if tag in graph.meta_info_def.tags and signature in graph.signature_def:
                sig = graph.signature_def[signature]
                tensors = [*sig.inputs.values(), *sig.outputs.values()]
                return bool(tensors) and all(
                    not t.tensor_shape.unknown_rank and t.tensor_shape.dim and t.tensor_shape.dim[0].size == -1
                    for t in tensors
                )
        return False

    @staticmethod
    def _describe(name: str, tensor: Any, batched: bool, kind: str) -> TensorSpec:
        datatype = _TF_TYPES.get(tensor.dtype.name)
        if datatype is None:
            raise ValueError(f"{kind} '{name}' has dtype {tensor.dtype.name}, which Switchyard cannot serve")
        dims = [-1 if d is None else int(d) for d in tensor.shape.as_list()] if tensor.shape.rank is not None else [-1]
        if batched:
            if not dims or dims[0] != -1:
                raise ValueError(
                    f"{kind} '{name}' has shape {tensor.shape} in the SavedModel: with max_batch_size > 0 "
                    "its first dimension must be the variable batch dimension (None); set "
                    "max_batch_size: 0 or export the model with a None batch dimension"
                )
            dims = dims[1:]
        return TensorSpec(name, datatype, dims)

    def describe(self) -> dict[str, Any]:
        return {"inputs": list(self._inputs.values()), "outputs": list(self._outputs)}

    def execute(self, requests: list[dict[str, Any]]) -> list[Any]:
        import tensorflow as tf

        assert self._spec is not None
        batch, sizes = concat_requests(self._spec, requests)
        missing = [name for name in self._inputs if name not in batch]
        if missing:  # a signature input the config marked optional and the client left out
            raise ValueError(f"the SavedModel's signature needs input(s) {', '.join(missing)}")
        feed = {}
        for name, array in batch.items():
            dtype = tf.string if array.dtype == object else None
            feed[name] = tf.constant(array, dtype=dtype)
        result = self._function(**feed)
        outputs = {t.name: result[t.name].numpy() for t in self._outputs}
        return split_outputs(self._spec, outputs, sizes)

    def unload(self) -> None:
        self._function = None
        self._loaded = None
