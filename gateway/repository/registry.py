"""Which loaded model answers a served name: the lookup every frontend reads on every request.

Two kinds of model share it: LLMs (`LoadedLLM`: an engine behind an `LLMScheduler`, for /v1 and v2 generate) and
tensor models (`LoadedTensorModel`: backend instances behind batchers, for v2 infer, /v1/embeddings and rerank).
What is loaded, and when, is the lifecycle's business (`model_control.ModelControl`, as Triton keeps model
lifecycle apart from the repository manager); it alone publishes and withdraws models here.
"""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequestError, ModelNotFoundError
from gateway.keys import context as key_context
from gateway.repository.loaded_model import LoadedLLM, LoadedModel, LoadedTensorModel
from gateway.tensor.model import TensorModel

__all__ = ["LoadedLLM", "LoadedModel", "LoadedTensorModel", "ModelRegistry"]


class ModelRegistry:
    """Loaded models by served name."""

    def __init__(self) -> None:
        self._models: dict[str, LoadedModel] = {}
        self.on_demand: Any = None  # on_demand.OnDemandLoader: loads models on request (set by model control)

    # ------------------------------------------------------------------ lookups (frontends)

    def get(self, name: str) -> LoadedModel:
        """The model serving `name`; 404 (`model_not_found`) when none does, or when the caller's named key may not
        use it (as if it did not exist)."""
        key_context.check_model(name)
        model = self.find(name)
        if model is None:
            raise ModelNotFoundError(name)
        return model

    def find(self, name: str) -> LoadedModel | None:
        """The model serving `name`: a loaded model, else a LoRA adapter of one (`<model>:<adapter>`, or the
        adapter's bare name; adapter_catalog.py)."""
        return self._models.get(name) or self._adapter(name)

    def _adapter(self, name: str) -> LoadedModel | None:
        base, qualified, adapter = name.rpartition(":")
        for model in self._models.values():
            catalog = model.adapters if isinstance(model, LoadedLLM) else None
            if catalog is None:
                continue
            if qualified and model.name == base:
                return catalog.view(adapter)
            found = None if qualified else catalog.view(name, bare=True)
            if found is not None:
                return found
        return None

    def adapters(self) -> list[LoadedModel]:
        """The LoRA adapters of the loaded models (`/v1/models` lists them), each under its bare name as vLLM lists
        its `lora_name`, or as <model>:<adapter> where another model or adapter has that name."""
        found = []
        for model in self._models.values():
            if not isinstance(model, LoadedLLM) or model.adapters is None:
                continue
            for view in model.adapters.views():
                name = view.name.rpartition(":")[2]
                bare = model.adapters.view(name, bare=True)
                found.append(bare if bare is not None and self.find(name) is bare else view)
        return found

    async def acquire(self, name: str, keep_alive: float | None = None) -> LoadedModel:
        """The model serving `name` for a request (what every inference route calls): a model of the repository
        that loads on request is loaded first while the request waits, and the request holds it (no eviction)
        until its response is sent (`on_demand.py`); 404 as `get` otherwise (a named key's model check included,
        before any load). `keep_alive`: the request's own."""
        if self.on_demand is None:
            return self.get(name)
        key_context.check_model(name)
        return await self.on_demand.acquire(name, keep_alive)

    async def acquire_llm(self, name: str, keep_alive: float | None = None) -> LoadedLLM:
        """`acquire` for a model that generates text; 400 for a model of another kind."""
        return self._text_model(await self.acquire(name, keep_alive), name)

    def llm(self, name: str) -> LoadedLLM:
        """A loaded model that generates text; 400 for a model of another kind (e.g. an embedding model)."""
        return self._text_model(self.get(name), name)

    @staticmethod
    def _text_model(model: LoadedModel, name: str) -> LoadedLLM:
        if not isinstance(model, LoadedLLM):
            raise InvalidRequestError(
                f"The model '{name}' does not generate text (it serves /v1/embeddings or /v2 infer).", param="model"
            )
        return model

    def find_tensor(self, name: str) -> TensorModel | None:
        """The runtime of the tensor model serving `name` (what an ensemble step calls), or None."""
        model = self._models.get(name)
        return model.tensor if isinstance(model, LoadedTensorModel) else None

    def llms(self) -> list[LoadedLLM]:
        """The LLMs: what sessions, tokenize, health and LLM metrics iterate."""
        return [m for m in self._models.values() if isinstance(m, LoadedLLM)]

    def all_models(self) -> list[LoadedModel]:
        """Every loaded model, LLMs and tensor models."""
        return list(self._models.values())

    def in_folder(self, folder: str) -> LoadedModel | None:
        """The loaded copy of a model folder (its served name may differ), or None."""
        return next((m for m in self._models.values() if m.folder == folder), None)

    # ------------------------------------------------------------------ changes (model control only)

    def publish(self, entry: LoadedModel, replaces: LoadedModel | None = None) -> None:
        """Serve `entry` from now on, in place of `replaces` (a reload, whose served name may have changed)."""
        if replaces is not None and self._models.get(replaces.name) is replaces:
            del self._models[replaces.name]
        self._models[entry.name] = entry

    def withdraw(self, entry: LoadedModel) -> None:
        """Stop serving `entry` (an unload): new lookups of its name find nothing."""
        if self._models.get(entry.name) is entry:
            del self._models[entry.name]
