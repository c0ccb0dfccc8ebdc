"""A v2 request checked against a tensor model's configuration, and the backend's answer shaped for the client.

Inputs must be declared, of the declared datatype and of the declared shape (with the implicit batch dimension
when `max_batch_size > 0`, its size within 1..max_batch_size, the same for every input); `reshape` is applied.
Outputs are cast to their declared datatype and filtered to what the client asked for.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from engines.types import TensorSpec
from gateway.errors import InternalError, InvalidRequestError
from gateway.repository.tensor_config import TensorModelConfig
from gateway.tensor.tensors import DATATYPES, InputTensor, OutputTensor

log = logging.getLogger("switchyard.tensor")


def prepare_inputs(
    model: str, config: TensorModelConfig, declared_inputs: list[TensorSpec], inputs: Sequence[InputTensor]
) -> tuple[dict[str, np.ndarray], int]:
    """Check the request's tensors against the config; return the backend's inputs and the batch size."""
    declared = {s.name: s for s in declared_inputs}
    reshapes = {t.name: t.reshape.shape for t in config.input if t.reshape is not None}
    batched = config.max_batch_size > 0
    arrays: dict[str, np.ndarray] = {}
    rows: int | None = None
    for tensor in inputs:
        spec = declared.get(tensor.name)
        if spec is None:
            raise InvalidRequestError(
                f"unexpected input '{tensor.name[:64]}' for model '{model}'; it takes {', '.join(declared)}"
            )
        if tensor.datatype != spec.datatype:
            raise InvalidRequestError(
                f"input '{spec.name}': datatype {tensor.datatype} does not match the model's {spec.datatype}"
            )
        shape = tuple(tensor.array.shape)
        expected = ([-1] if batched else []) + list(spec.dims)
        if len(shape) != len(expected) or any(e != -1 and e != s for e, s in zip(expected, shape, strict=True)):
            raise InvalidRequestError(f"input '{spec.name}': shape {list(shape)} does not match the model's {expected}")
        if batched:
            if not 1 <= shape[0] <= config.max_batch_size:
                raise InvalidRequestError(
                    f"input '{spec.name}': batch size {shape[0]} is outside 1..{config.max_batch_size} "
                    f"(max_batch_size of model '{model}')"
                )
            if rows is not None and shape[0] != rows:
                raise InvalidRequestError("all inputs must have the same batch size (first dimension)")
            rows = shape[0]
        array = tensor.array
        if spec.name in reshapes:
            target = ([shape[0]] if batched else []) + list(reshapes[spec.name])
            try:
                array = array.reshape(target)
            except ValueError:
                raise InvalidRequestError(
                    f"input '{spec.name}': shape {list(shape)} cannot be reshaped to {target}"
                ) from None
        arrays[spec.name] = array
    missing = [s.name for s in declared_inputs if not s.optional and s.name not in arrays]
    if missing:
        raise InvalidRequestError(f"model '{model}' needs input(s) {', '.join(missing)}")
    return arrays, rows or 1


def finish_outputs(
    model: str,
    config: TensorModelConfig,
    declared_outputs: list[TensorSpec],
    result: dict[str, Any],
    wanted: Sequence[str],
) -> list[OutputTensor]:
    """Backend outputs -> response tensors: declared datatype, declared order, only what was asked for."""
    declared = {s.name: s for s in declared_outputs}
    unknown = [n for n in wanted if n not in declared]
    if unknown:
        raise InvalidRequestError(f"model '{model}' has no output '{unknown[0][:64]}'; it has {', '.join(declared)}")
    names = list(wanted) or [s.name for s in declared_outputs]
    reshapes = {t.name: t.dims for t in config.output if t.reshape is not None}
    outputs = []
    for name in names:
        if name not in result:
            if wanted:
                raise InternalError(f"model '{model}' did not produce the requested output '{name}'")
            continue
        spec = declared[name]
        try:
            array = np.asarray(result[name], dtype=DATATYPES[spec.datatype])
        except (TypeError, ValueError):
            log.error("model '%s' output '%s' cannot be converted to %s", model, name, spec.datatype)
            raise InternalError(f"model '{model}' returned an invalid '{name}' output") from None
        if name in reshapes:
            lead = [array.shape[0]] if config.max_batch_size > 0 and array.ndim else []
            target = lead + list(reshapes[name])
            if math.prod(d for d in target if d != -1) and target.count(-1) <= 1:
                try:
                    array = array.reshape(target)
                except ValueError:
                    pass
        outputs.append(OutputTensor(name, array, spec.datatype))
    return outputs
