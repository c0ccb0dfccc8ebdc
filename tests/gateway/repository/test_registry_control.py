"""Model control modes in the registry (Triton's none / explicit / poll), hostile names on load/unload, startup
failures that no longer stop the server, and the load API's keep_alive."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import ConfigError, InvalidRequestError, ModelNotFoundError
from gateway.repository.model_control import CONTROL_DISABLED, ModelControl, ModelControlDisabledError
from tests.gateway.repository.residency_harness import Clock, control_of, repo_of
from tests.gateway.repository.residency_harness import start as start_control
from tests.gateway.repository.tiny_models import write_tagger, x_input


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write_tagger(root, "tagger", tag="a")
    write_tagger(root, "other", tag="o")
    return root


async def tag_of(registry: ModelControl, name: str = "tagger") -> str:
    _, outputs = await registry.models.get(name).tensor.infer([x_input()])
    return next(o for o in outputs if o.name == "TAG").array[0, 0].decode()


async def start(registry: ModelControl) -> None:
    registry.prepare()
    for model in registry.load_all():
        await model.start()


async def close(registry: ModelControl) -> None:
    await registry.close()
    for model in registry.models.all_models():
        await model.stop()


@pytest.mark.parametrize("mode", ["none", "poll"])
async def test_load_and_unload_are_refused_outside_explicit_mode(repo: Path, mode: str) -> None:
    registry = ModelControl(repo, control_mode=mode)
    await start(registry)
    try:
        assert {m.name for m in registry.models.all_models()} == {"tagger", "other"}  # everything loads at startup
        for call in (registry.load("tagger"), registry.unload("tagger"), registry.load("../etc")):
            with pytest.raises(ModelControlDisabledError) as refused:
                await call
            assert refused.value.status == 503  # Triton: UNAVAILABLE
            assert refused.value.kserve_body()["error"].startswith(CONTROL_DISABLED)
            assert f"model control mode is '{mode}'" in refused.value.message
            assert ("--model-control-mode=explicit" in refused.value.message) == (mode == "none")
        assert await tag_of(registry) == "v1:a"  # still serving
    finally:
        await close(registry)


async def test_explicit_mode_loads_nothing_until_asked(repo: Path) -> None:
    registry = ModelControl(repo, control_mode="explicit")
    await start(registry)
    try:
        assert registry.models.all_models() == []
        # never loaded: the name only, as Triton
        assert registry.states.index() == [{"name": "other"}, {"name": "tagger"}]
        assert registry.states.index(ready_only=True) == []
        with pytest.raises(ModelNotFoundError):
            registry.models.get("tagger")
        await registry.load("tagger")
        assert await tag_of(registry) == "v1:a"
        assert {"name": "tagger", "version": "1", "state": "READY", "reason": ""} in registry.states.index()
        await registry.unload("tagger")
        with pytest.raises(ModelNotFoundError):
            registry.models.get("tagger")
        unloaded = {"name": "tagger", "version": "", "state": "UNAVAILABLE", "reason": "unloaded"}
        assert unloaded in registry.states.index()
    finally:
        await close(registry)


async def test_explicit_mode_loads_the_named_models_at_startup(repo: Path) -> None:
    registry = ModelControl(repo, control_mode="explicit", load_models=["tagger"])
    await start(registry)
    try:
        assert [m.name for m in registry.models.all_models()] == ["tagger"]
    finally:
        await close(registry)
    everything = ModelControl(repo, control_mode="explicit", load_models=["*"])
    await start(everything)
    try:
        assert {m.name for m in everything.models.all_models()} == {"tagger", "other"}
    finally:
        await close(everything)


def test_unknown_or_bad_startup_model_is_a_config_error(repo: Path) -> None:
    with pytest.raises(ConfigError, match=r"--load-model missing: .* no model folder 'missing'"):
        ModelControl(repo, control_mode="explicit", load_models=["missing"]).prepare()
    with pytest.raises(ConfigError, match="--load-model"):
        ModelControl(repo, control_mode="explicit", load_models=["../tagger"]).prepare()


def test_empty_repository_is_an_error_only_in_none_mode(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="--model-control-mode=poll or explicit"):
        ModelControl(tmp_path / "empty").prepare()
    for mode in ("explicit", "poll"):
        registry = ModelControl(tmp_path / "empty", control_mode=mode)
        registry.prepare()
        assert registry.load_all() == []


HOSTILE = [
    "..",
    ".",
    "../etc",
    "../../etc/passwd",
    "/etc/passwd",
    "/",
    "a/../tagger",
    "tagger/",
    "./tagger",
    "tagger/1",
    "%2e%2e",
    "%2e%2e%2fetc",
    "..%2ftagger",
    "%2Fetc",
    "tagger%00",
    "tagger\x00",
    "tag\nger",
    "tagger\r",
    "\ttagger",
    "tagger\x1b[31m",
    "tag ger",
    " tagger",
    "a\\..\\b",
    "C:\\Windows",
    "~root",
    "$HOME",
    "tagger;rm",
    "tägger",
    "ｔagger",
    "",
    "-tagger",
    "a" * 200,
    "tagger\u202e",
]


@pytest.mark.parametrize("name", HOSTILE)
async def test_hostile_names_are_400_before_the_file_system(repo: Path, name: str, monkeypatch) -> None:
    registry = ModelControl(repo, control_mode="explicit")
    registry.prepare()
    from gateway.repository import layout

    touched: list[Path] = []
    real_is_dir = Path.is_dir

    def spy(self: Path) -> bool:
        touched.append(self)
        return real_is_dir(self)

    monkeypatch.setattr(layout.Path, "is_dir", spy)
    for call in (registry.load, registry.unload):
        with pytest.raises(InvalidRequestError) as refused:
            await call(name)
        assert refused.value.status == 400 and "not a valid model name" in refused.value.message
    assert touched == []  # refused before any path was built from the name
    assert registry.models.all_models() == []


async def test_startup_failures_are_reported_and_the_others_serve(tmp_path: Path, clock: Clock, started: list) -> None:
    repo_of(tmp_path, "good")
    bad = write_tagger(tmp_path, "bad")
    (bad / "config.yaml").write_text((bad / "config.yaml").read_text() + "max_batch_sise: 3\n")
    control = await start_control(control_of(tmp_path, clock, mode="none"), started)
    assert [m.name for m in control.models.all_models()] == ["good"]
    row = next(r for r in control.states.index() if r["name"] == "bad")
    assert row["state"] == "UNAVAILABLE" and "max_batch_sise" in row["reason"]
    strict = control_of(tmp_path, clock, mode="none", exit_on_error=True)
    with pytest.raises(ConfigError, match=r"(?s)model 'bad' failed to load: .*max_batch_sise.*--exit-on-error"):
        strict.prepare()


async def test_the_load_api_takes_a_keep_alive(tmp_path: Path, clock: Clock, started: list) -> None:
    from gateway.errors import InvalidRequestError
    from gateway.kserve.data_plane import DataPlane

    control = await start_control(control_of(repo_of(tmp_path, "a"), clock), started)
    plane = DataPlane(control.models, control)
    await plane.load("a", {"keep_alive": -1})
    assert control.residency.memory.resident["a"].pinned
    await plane.load("a", {"keep_alive": "2m"})  # a reload: its keep-alive from now on
    assert control.residency.memory.resident["a"].keep_alive == 120
    with pytest.raises(InvalidRequestError, match="parameter 'keep_alive': 'later' is not a duration"):
        await plane.load("a", {"keep_alive": "later"})
