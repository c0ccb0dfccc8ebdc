"""The LoRA adapters served over one base model: their names, files, ids and the requests running under each.

An adapter is served as `<base>:<adapter>` and, as vLLM serves its `lora_name`, under its bare name when no other
model or adapter has it. Adapters come from the model's config (`lora_adapters`, loaded with the model) or from
vLLM's admin calls at run time (`POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter`; gateway/openai/
lora_admin.py). Their files must be inside the base model's folder or one of the server's adapter folders
(`--lora-dir`), so that a network call names no other file of the machine.

Each load gets a new `AdapterRef.id`: the KV cache is keyed by it (prefix_cache.root_hash), so an adapter loaded
again under the same name never reads the blocks its previous weights computed. Unloading stops new requests at
once and drops the weights once the requests running under the adapter have finished.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engines.interface import AdapterHost
from engines.types import AdapterRef
from gateway.errors import ConfigError, InvalidRequestError, NotFoundError
from gateway.repository.adapter_model import LoadedAdapter, ServedAdapter
from gateway.repository.layout import ModelDir, is_valid_model_name

if TYPE_CHECKING:
    from gateway.repository.loaded_model import LoadedLLM
    from gateway.repository.registry import ModelRegistry

log = logging.getLogger("switchyard.repository")

_ids = itertools.count(1)  # AdapterRef.id: unique in the process (0 is the base model)
DRAIN_TIMEOUT_S = 30.0


class AdapterCatalog:
    """The adapters of one loaded base model (`LoadedLLM.adapters`); its engine holds their weights."""

    def __init__(self, base: LoadedLLM, engine: AdapterHost, model_dir: Path, lora_dirs: tuple[Path, ...] = ()) -> None:
        self.base, self._engine = base, engine
        self._roots = (model_dir.resolve(), *(Path(d).resolve() for d in lora_dirs))
        # by adapter name: its served model as <base>:<adapter> and as its bare name (the name a response echoes)
        self._served: dict[str, tuple[LoadedAdapter, LoadedAdapter]] = {}
        self.lock = asyncio.Lock()  # one admin call at a time changes it

    # ------------------------------------------------------------------ lookups

    def view(self, name: str, bare: bool = False) -> LoadedAdapter | None:
        """The served model of adapter `name`, named <base>:<adapter> (or its bare name), or None."""
        found = self._served.get(name)
        return None if found is None else found[bare]

    def views(self) -> list[LoadedAdapter]:
        """Every adapter, named <base>:<adapter>."""
        return [qualified for qualified, _ in self._served.values()]

    # ------------------------------------------------------------------ loading

    def resolve(self, path: str) -> Path:
        """`path` (relative: to the model's folder) as a file or folder inside the allowed folders; 400 otherwise,
        saying where adapters may be."""
        given = Path(path)
        target = (given if given.is_absolute() else self._roots[0] / given).resolve()
        if not any(target == root or root in target.parents for root in self._roots):
            raise InvalidRequestError(
                f"lora_path '{path[:200]}' is outside the model's folder and the server's adapter folders; put the "
                f"adapter inside the model's folder or start the server with --lora-dir naming a folder that holds "
                f"it",
                param="lora_path",
            )
        if not target.exists():
            raise InvalidRequestError(f"lora_path '{path[:200]}' does not exist", param="lora_path")
        return target

    def check_name(self, name: str) -> None:
        if not is_valid_model_name(name):
            raise InvalidRequestError(
                f"lora_name '{name[:80]}' is not a valid adapter name (letters, digits, '.', "
                "'_' and '-'; the base model is named apart: <model>:<adapter>)",
                param="lora_name",
            )

    def load(self, name: str, path: str, replace: bool = False) -> tuple[LoadedAdapter, LoadedAdapter | None]:
        """Read the adapter and serve it (blocking: call off the event loop): (its served model, the one it
        replaced, which the caller `drop`s). `replace`: swap an adapter of that name for the new files (vLLM's
        `load_inplace`); requests running under the old one finish on it."""
        self.check_name(name)
        if name in self._served and not replace:
            raise InvalidRequestError(
                f"The lora adapter '{name}' has already been loaded; unload it first, or "
                "send load_inplace: true to replace it",
                param="lora_name",
            )
        target = self.resolve(path)
        adapter = ServedAdapter(AdapterRef(name, next(_ids), str(target)), path)
        self._engine.load_adapter(adapter.ref)
        view = LoadedAdapter.of(self.base, adapter)
        replaced = self.view(name)
        self._served[name] = (view, view.named(name))
        log.info("model '%s': LoRA adapter '%s' loaded from %s (id %d)", self.base.name, name, path, adapter.ref.id)
        return view, replaced

    async def unload(self, name: str) -> None:
        """Stop serving adapter `name`: new requests are refused at once; its weights go once its running requests
        have finished (at most DRAIN_TIMEOUT_S). 404 when it is not loaded."""
        views = self._served.pop(name, None)
        if views is None:
            raise NotFoundError(f"The lora adapter '{name[:80]}' cannot be found.")
        await self.drop(views[0])

    async def drop(self, view: LoadedAdapter) -> None:
        """Close `view`'s adapter to new requests, let the running ones finish, then free its weights."""
        adapter = view.adapter
        adapter.closed = True
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while adapter.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if adapter.in_flight:
            log.warning(
                "LoRA adapter '%s': %d request(s) still running after %gs; unloading it under them",
                adapter.ref.name,
                adapter.in_flight,
                DRAIN_TIMEOUT_S,
            )
        await asyncio.to_thread(self._engine.unload_adapter, adapter.ref)
        log.info("model '%s': LoRA adapter '%s' unloaded", self.base.name, adapter.ref.name)


LORA_BACKENDS = ("pytorch", "vllm")  # the engines that serve adapters (the others refuse lora_adapters)


def load_adapters(
    base: LoadedLLM, model: ModelDir, engine: AdapterHost, models: ModelRegistry, lora_dirs: tuple[Path, ...] = ()
) -> AdapterCatalog:
    """`base`'s catalog with the adapters its config lists, loaded (blocking). A bad entry fails the model's load
    (ConfigError naming the entry and the fix), as a bad weights path does."""
    catalog = AdapterCatalog(base, engine, model.path, lora_dirs)
    for name, path in base.config.lora_adapters.items():
        other = base if name == base.name else models.find(name)
        if other is not None and (other is base or other.folder != model.name):
            raise ConfigError(
                f"{model.config_path}: lora_adapters: the name '{name}' is served already (by "
                f"'{other.name}'); rename the adapter"
            )
        try:
            catalog.load(name, path)
        except InvalidRequestError as exc:
            raise ConfigError(f"{model.config_path}: lora_adapters.{name}: {exc.message}") from None
        except ValueError as exc:  # the engine's refusal of the files (ModelFileError, RequestRefusedError, ...)
            raise ConfigError(f"{model.config_path}: lora_adapters.{name}: {exc}") from None
    return catalog
