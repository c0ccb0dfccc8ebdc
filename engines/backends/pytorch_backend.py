"""The `pytorch` backend (Triton platform `pytorch_libtorch`): a TorchScript `<version>/model.pt`
(`torch.jit.save`) or a `torch.export` program `model.pt2` (`torch.export.save`), one copy per instance.

Inputs are passed positionally in the config's `input` order (Triton's `INPUT__0, INPUT__1, ...` convention works
as is); the model returns a tensor or a tuple/list of tensors, matched to the config's `output` order.
BYTES tensors are not supported by this backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engines.backends.batching import concat_requests, model_file, split_outputs
from engines.cpu_budget import cpu_budget
from engines.interface import TensorBackend
from engines.torch_threads import TorchThreads
from engines.types import TensorModelSpec


class TorchScriptBackend(TensorBackend):
    def __init__(self) -> None:
        self._module: Any = None
        self._spec: TensorModelSpec | None = None
        self.threads = TorchThreads(1)

    def load(self, spec: TensorModelSpec) -> None:
        import torch

        if not spec.inputs or not spec.outputs:
            raise ValueError("the pytorch backend needs 'input' and 'output' in the model configuration")
        if any(t.datatype == "BYTES" for t in [*spec.inputs, *spec.outputs]):
            raise ValueError("the pytorch backend does not support BYTES tensors; use the python backend")
        default = spec.default_model_filename or "model.pt"
        path = model_file(spec, default)
        try:
            if path.endswith(".pt2"):
                self._module = torch.export.load(path).module()
            else:
                self._module = torch.jit.load(path, map_location="cpu")
                self._module.eval()
        except Exception as exc:  # torch raises many types for a bad file
            raise ValueError(
                f"'{spec.name}/{spec.version}/{default}' could not be loaded by torch: {str(exc)[:200]}"
            ) from None
        self._spec = spec
        self.threads = TorchThreads(spec.cpu_threads or cpu_budget().threads)

    def execute(self, requests: list[dict[str, Any]]) -> list[Any]:
        import torch

        assert self._spec is not None
        batch, sizes = concat_requests(self._spec, requests)
        args = [torch.from_numpy(np.ascontiguousarray(batch[t.name])) for t in self._spec.inputs if t.name in batch]
        self.threads.enter()  # its share of the CPU, on this batch thread (engines/torch_threads.py)
        with torch.inference_mode():
            result = self._module(*args)
        tensors = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(tensors) != len(self._spec.outputs):
            raise RuntimeError(
                f"the model returned {len(tensors)} tensors for {len(self._spec.outputs)} configured outputs"
            )
        outputs = {o.name: t.detach().cpu().numpy() for o, t in zip(self._spec.outputs, tensors, strict=True)}
        return split_outputs(self._spec, outputs, sizes)

    def unload(self) -> None:
        self._module = None
