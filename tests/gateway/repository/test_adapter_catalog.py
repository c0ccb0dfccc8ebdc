"""LoRA adapters as served models (adapter_catalog.py, adapter_model.py): where their files may be, their names in the
registry and /v1/models, new ids per load, and an unload that waits for the requests running under the adapter."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engines.interface import AdapterHost, ModelFileError
from engines.types import AdapterRef, GenerationOutput, GenerationRequest, SamplingParams
from gateway.errors import InvalidRequestError, ModelNotFoundError, NotFoundError
from gateway.repository.adapter_catalog import AdapterCatalog
from gateway.repository.loaded_model import LoadedLLM
from gateway.repository.model_config import ModelConfig
from gateway.repository.registry import ModelRegistry
from gateway.repository.serving import ServingScheduler
from tests.gateway.repository.test_registry_reload import FakeLLM


class FakeEngine(AdapterHost):
    def __init__(self) -> None:
        self.loaded: list[AdapterRef] = []
        self.unloaded: list[AdapterRef] = []

    def load_adapter(self, adapter: AdapterRef) -> None:
        if adapter.path.endswith("broken"):
            raise ModelFileError("broken: not a LoRA adapter")
        self.loaded.append(adapter)

    def unload_adapter(self, adapter: AdapterRef) -> None:
        self.unloaded.append(adapter)


class Recording(FakeLLM):
    """A scheduler that keeps the requests it is given."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        self.requests.append(request)
        async for out in super().generate(request):
            yield out


def _served(tmp_path: Path, name: str = "smol", gap: float = 0.01) -> tuple[LoadedLLM, FakeEngine, Recording]:
    folder = tmp_path / name
    (folder / "adapters" / "sql").mkdir(parents=True)
    (folder / "adapters" / "broken").mkdir()
    inner = Recording(name, tokens=3, gap=gap)
    model = LoadedLLM(name=name, config=ModelConfig(), scheduler=ServingScheduler(inner, name), folder=name)
    engine = FakeEngine()
    model.adapters = AdapterCatalog(model, engine, folder, (tmp_path / "shared",))
    return model, engine, inner


async def _run(model: LoadedLLM) -> list[GenerationOutput]:
    request = GenerationRequest("r", [1], SamplingParams())
    return [out async for out in model.scheduler.generate(request)]


def test_adapter_files_must_be_in_the_models_folder_or_a_lora_dir(tmp_path: Path) -> None:
    model, engine, _ = _served(tmp_path)
    catalog = model.adapters
    assert catalog is not None
    (tmp_path / "shared" / "chat").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "smol" / "adapters" / "escape").symlink_to(tmp_path / "elsewhere")
    catalog.load("sql", "adapters/sql")
    catalog.load("chat", str(tmp_path / "shared" / "chat"))
    assert [a.path for a in engine.loaded] == [
        str(tmp_path / "smol" / "adapters" / "sql"),
        str(tmp_path / "shared" / "chat"),
    ]
    for path in (str(tmp_path / "elsewhere"), "../elsewhere", "adapters/escape", "/etc"):
        with pytest.raises(InvalidRequestError, match="--lora-dir"):
            catalog.load("x", path)
    with pytest.raises(InvalidRequestError, match="does not exist"):
        catalog.load("x", "adapters/none")
    for bad in ("a:b", "../x", ""):
        with pytest.raises(InvalidRequestError, match="not a valid adapter name"):
            catalog.load(bad, "adapters/sql")
    with pytest.raises(InvalidRequestError, match="already been loaded"):
        catalog.load("sql", "adapters/sql")
    with pytest.raises(ModelFileError, match="broken"):
        catalog.load("b", "adapters/broken")
    assert catalog.view("b") is None


def test_names_in_the_registry_and_the_model_list(tmp_path: Path) -> None:
    registry = ModelRegistry()
    smol, engine, _ = _served(tmp_path)
    other, _, _ = _served(tmp_path / "o", "sql")  # a model named like smol's adapter
    registry.publish(smol)
    registry.publish(other)
    smol.adapters.load("sql", "adapters/sql")  # type: ignore[union-attr]
    smol.adapters.load("chat", "adapters/sql")  # type: ignore[union-attr]
    assert registry.get("smol:sql").name == "smol:sql" and registry.get("smol:sql").parent is smol
    assert registry.get("sql") is other  # a model's name wins over an adapter's bare name
    assert registry.get("chat").name == "chat" and registry.llm("chat").adapter.ref.name == "chat"
    with pytest.raises(ModelNotFoundError):
        registry.get("sql:chat")  # the model `sql` has no adapters of that name
    assert sorted(m.name for m in registry.adapters()) == ["chat", "smol:sql"]  # bare where the name is free
    assert [a.id for a in engine.loaded] == sorted({a.id for a in engine.loaded})  # a new id per load


async def test_requests_run_under_the_adapter_and_unload_waits_for_them(tmp_path: Path) -> None:
    model, engine, inner = _served(tmp_path, gap=0.1)
    catalog = model.adapters
    assert catalog is not None
    view, replaced = catalog.load("sql", "adapters/sql")
    assert replaced is None
    running = asyncio.create_task(_run(view))
    await asyncio.sleep(0.05)
    unloading = asyncio.create_task(catalog.unload("sql"))
    await asyncio.sleep(0.05)
    assert not engine.unloaded  # the request under it is still running
    with pytest.raises(ModelNotFoundError):
        await _run(view)  # no new request under an adapter being unloaded
    assert len(await running) == 3
    await asyncio.wait_for(unloading, 2)
    assert engine.unloaded == engine.loaded
    assert inner.requests[0].adapter == engine.loaded[0]
    with pytest.raises(NotFoundError):
        await catalog.unload("sql")


async def test_load_inplace_replaces_an_adapter_with_a_new_id(tmp_path: Path) -> None:
    model, engine, _ = _served(tmp_path)
    catalog = model.adapters
    assert catalog is not None
    first, _ = catalog.load("sql", "adapters/sql")
    second, replaced = catalog.load("sql", "adapters/sql", replace=True)
    assert replaced is not None and replaced.adapter is first.adapter
    assert second.adapter.ref.id != first.adapter.ref.id
    await catalog.drop(replaced)
    assert engine.unloaded == [first.adapter.ref] and catalog.view("sql") is second
