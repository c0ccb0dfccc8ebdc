"""KServe v2 tensor backends. Each backend's library is imported only when a model uses that backend."""

from __future__ import annotations

import importlib

from engines.interface import TensorBackend

_BACKENDS = {
    "python": ("engines.backends.python_backend", "PythonBackend"),
    "onnxruntime": ("engines.backends.onnxruntime_backend", "OnnxRuntimeBackend"),
    "pytorch": ("engines.backends.pytorch_backend", "TorchScriptBackend"),
    "transformers": ("engines.backends.transformers_backend", "TransformersBackend"),
    "fil": ("engines.backends.fil_backend", "ForestBackend"),
    "tensorflow": ("engines.backends.tensorflow_backend", "SavedModelBackend"),
}


def backend_names() -> list[str]:
    return list(_BACKENDS)


def create_backend(name: str) -> TensorBackend:
    """A fresh, unloaded backend instance; `ValueError` for an unknown name or a missing library."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown tensor backend {name!r}; use one of {', '.join(_BACKENDS)}")
    module_name, class_name = _BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"backend {name!r} needs the Python package '{exc.name}'; install it (pip install {exc.name})"
        ) from None
    return getattr(module, class_name)()
