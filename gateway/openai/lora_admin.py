"""vLLM's LoRA admin calls: `POST /v1/load_lora_adapter` {lora_name, lora_path} and `POST /v1/unload_lora_adapter`
{lora_name}, behind the admin key (gateway/keys/auth.py). Success answers in vLLM's words, as plain text; failures are
OpenAI-shaped errors. Which model an adapter goes on: `model` (ours; vLLM serves one base model), else the base
named in `<model>:<adapter>`, else the one loaded model that serves adapters."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import InvalidRequestError, NotFoundError
from gateway.repository.adapter_catalog import AdapterCatalog
from gateway.repository.adapter_model import LoadedAdapter
from gateway.repository.registry import LoadedLLM, ModelRegistry

router = APIRouter()
PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")  # admin routes (gateway/keys/auth.py)


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(..., min_length=1, max_length=200)
    lora_path: str = Field(..., min_length=1, max_length=4096)
    load_inplace: bool = False  # vLLM's: replace an adapter of that name (requests on the old one finish on it)
    model: str | None = Field(None, max_length=200, description="The base model; needed when several serve adapters.")


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(..., min_length=1, max_length=200)
    lora_int_id: int | None = None  # vLLM's; the name decides
    model: str | None = Field(None, max_length=200)


def _catalog(registry: ModelRegistry, lora_name: str, model: str | None) -> tuple[AdapterCatalog, str]:
    """The catalog the call is about and the adapter's bare name."""
    base, qualified, name = lora_name.rpartition(":")
    if qualified and model not in (None, base):
        raise InvalidRequestError(
            f"lora_name names the model '{base}' and model '{model}'; give one of them", param="model"
        )
    wanted = base if qualified else model
    if wanted is not None:
        found = registry.find(wanted)
        catalog = found.adapters if isinstance(found, LoadedLLM) and found.name == wanted else None
        if not isinstance(catalog, AdapterCatalog):
            raise NotFoundError(
                f"no loaded model '{wanted[:200]}' that serves LoRA adapters (backend: pytorch or vllm)"
            )
        return catalog, name
    serving: list[AdapterCatalog] = []
    for m in registry.llms():
        if isinstance(m.adapters, AdapterCatalog):
            serving.append(m.adapters)
    if len(serving) != 1:
        names = ", ".join(c.base.name for c in serving) or "none"
        raise InvalidRequestError(
            f"name the base model in 'model' (models that serve LoRA adapters: {names})", param="model"
        )
    return serving[0], name


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    registry: ModelRegistry = request.app.state.registry
    catalog, name = _catalog(registry, body.lora_name, body.model)
    catalog.check_name(name)
    other = registry.find(name)
    if other is not None and not (isinstance(other, LoadedAdapter) and other.parent is catalog.base):
        raise InvalidRequestError(
            f"the name '{name}' is served already (by '{other.name}'); choose another lora_name", param="lora_name"
        )
    async with catalog.lock:
        try:
            _, replaced = await asyncio.to_thread(catalog.load, name, body.lora_path, body.load_inplace)
        except ValueError as exc:  # the engine's refusal of the files (ModelFileError, RequestRefusedError, ...)
            raise InvalidRequestError(str(exc), param="lora_path") from None
        if replaced is not None:
            await catalog.drop(replaced)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> PlainTextResponse:
    catalog, name = _catalog(request.app.state.registry, body.lora_name, body.model)
    async with catalog.lock:
        await catalog.unload(name)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
