"""Which served model an Ollama request names, with Ollama's errors: 404 `model 'x' not found`, and 400
`"x" does not support chat` (or generate, embeddings) for a model of the wrong kind.

Ollama's names carry a tag (`llama3:latest`; a bare name means `:latest`); served names here have none, so a name
that is not served as written is looked up again without `:latest`.

Requests take their model through `acquire`, the registry's path for every inference route: a model of the
repository that loads on request is loaded first (the request waits, as on Ollama), the request holds it until its
answer is sent (no eviction meanwhile), and the request's `keep_alive` becomes the model's from then on.
"""

from __future__ import annotations

import math

from gateway.errors import InvalidRequestError, ModelNotFoundError, NotFoundError
from gateway.repository.lifecycle_config import FOREVER
from gateway.repository.loaded_model import LoadedLLM, LoadedModel, LoadedTensorModel
from gateway.repository.registry import ModelRegistry
from gateway.tensor.embedding import can_embed

LATEST = ":latest"


class OllamaModelNotFoundError(NotFoundError):
    def __init__(self, name: str) -> None:
        super().__init__(f"model '{name[:256]}' not found", param="model")


def find(registry: ModelRegistry, name: str) -> LoadedModel | None:
    model = registry.find(name)
    if model is None and name.endswith(LATEST):
        model = registry.find(name.removesuffix(LATEST))
    return model


async def acquire(registry: ModelRegistry, name: str, keep_alive: float | None = None) -> LoadedModel:
    """The model serving `name` for this request, loaded first where it loads on request, and held until the
    answer is sent; Ollama's 404 otherwise. `keep_alive`: the request's, in seconds (`keep_alive.parse_keep_alive`;
    infinite: never unload), applied to models that load on request (others stay as their mode keeps them)."""
    keep = FOREVER if keep_alive is not None and math.isinf(keep_alive) else keep_alive
    if name.endswith(LATEST):
        try:
            return await registry.acquire(name, keep)
        except ModelNotFoundError:
            pass
    try:
        return await registry.acquire(name.removesuffix(LATEST), keep)
    except ModelNotFoundError:
        raise OllamaModelNotFoundError(name) from None


def unsupported(name: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(f'"{name[:256]}" does not support {what}', param="model")


def text_model(model: LoadedModel, name: str, route: str) -> LoadedLLM:
    """The model as an LLM; 400 for a model that does not generate text (`route`: chat or generate)."""
    if not isinstance(model, LoadedLLM):
        raise unsupported(name, route)
    return model


def embeds(model: LoadedModel) -> bool:
    return isinstance(model, LoadedTensorModel) and can_embed(model.tensor)


def served(model: LoadedModel) -> bool:
    """Whether the Ollama API serves the model: LLMs and embedding models (not other tensor models)."""
    return isinstance(model, LoadedLLM) or embeds(model)
