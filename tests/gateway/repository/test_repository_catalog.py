"""The repository's catalog (repository_catalog.py): which folders load at startup and which on request (by mode
and by their `load:`), their keep-alive, the served names a request loads, an ensemble's steps, names from the
network, and what a load request's config may not override."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import ConfigError, InvalidRequestError, NotFoundError
from gateway.repository.lifecycle_config import FOREVER
from gateway.repository.repository_catalog import RepositoryCatalog
from tests.gateway.repository.tiny_models import write_tagger

ENSEMBLE = """platform: ensemble
max_batch_size: 8
load: on_request
input:
  - {name: X, data_type: FP32, dims: [1]}
output:
  - {name: Y, data_type: FP32, dims: [1]}
ensemble_scheduling:
  step:
    - {model_name: lazy, model_version: -1, input_map: {X: X}, output_map: {Y: Y}}
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_tagger(tmp_path, "always")
    lazy = write_tagger(tmp_path, "lazy")
    (lazy / "config.yaml").write_text((lazy / "config.yaml").read_text() + "load: on_request\nkeep_alive: 30s\n")
    (tmp_path / "pipe" / "1").mkdir(parents=True)
    (tmp_path / "pipe" / "config.yaml").write_text(ENSEMBLE)
    return tmp_path


def test_models_that_load_on_request_and_their_keep_alive(repo: Path) -> None:
    catalog = RepositoryCatalog(repo, control_mode="none", default_keep_alive=300.0)
    catalog.refresh()
    assert sorted(catalog.on_request_models()) == ["lazy", "pipe"]
    assert catalog.requestable("lazy") == "lazy" and catalog.requestable("always") is None
    assert catalog.loads_on_request("lazy") and not catalog.loads_on_request("always")
    assert catalog.ensemble_steps("pipe") == ["lazy"] and catalog.ensemble_steps("lazy") == []
    assert catalog.is_ensemble("pipe") and not catalog.is_ensemble("lazy") and not catalog.is_ensemble("../x")
    configs = {m.name: catalog.read_config(m) for m in catalog.startup_models()}
    assert catalog.loads_at_startup(configs["always"]) and not catalog.loads_at_startup(configs["lazy"])
    assert catalog.keep_alive_for(configs["always"]) == FOREVER  # Triton's modes keep what they load
    assert catalog.keep_alive_for(configs["lazy"]) == 30.0  # its config's
    assert catalog.keep_alive_for(configs["lazy"], -1.0) == -1.0  # a load's own
    on_demand = RepositoryCatalog(repo, control_mode="on_demand", default_keep_alive=300.0)
    on_demand.refresh()
    assert sorted(on_demand.on_request_models()) == ["always", "lazy", "pipe"]
    assert not on_demand.loads_at_startup(configs["always"])
    assert on_demand.keep_alive_for(configs["always"]) == 300.0  # the server's --keep-alive


def test_an_unknown_name_rescans_the_repository(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = RepositoryCatalog(repo, control_mode="on_demand")
    catalog.refresh()
    write_tagger(repo, "new")
    assert catalog.requestable("new") is None  # scanned just now: not again within CATALOG_RESCAN_S
    monkeypatch.setattr("gateway.repository.repository_catalog.CATALOG_RESCAN_S", -1.0)
    assert catalog.requestable("new") == "new"


def test_startup_models_by_mode(repo: Path) -> None:
    assert [m.name for m in RepositoryCatalog(repo).startup_models()] == ["always", "lazy", "pipe"]
    named = RepositoryCatalog(repo, control_mode="explicit", load_models=["lazy"])
    assert named.named_at_startup() and [m.name for m in named.startup_models()] == ["lazy"]
    assert not RepositoryCatalog(repo, control_mode="explicit", load_models=["*"]).named_at_startup()
    with pytest.raises(ConfigError, match="is not a directory"):
        RepositoryCatalog(repo / "missing").startup_models()


def test_names_from_the_network(repo: Path) -> None:
    catalog = RepositoryCatalog(repo, public=lambda message: message.replace(str(repo), "."))
    assert catalog.find("lazy").name == "lazy"
    with pytest.raises(InvalidRequestError, match="not a valid model name"):
        catalog.find("../etc")
    with pytest.raises(NotFoundError, match="no model named 'nope'"):
        catalog.find("nope")


def test_a_load_request_may_not_override_the_weights_or_pickles(repo: Path) -> None:
    catalog = RepositoryCatalog(repo)
    model = catalog.find("always")
    override = catalog.read_config(model).model_dump(exclude_none=True, exclude={"model"})
    assert catalog.read_config(model, override).max_batch_size == 8
    with pytest.raises(ConfigError, match="may not set 'model'"):
        catalog.read_config(model, {**override, "model": {}})
    with pytest.raises(ConfigError, match="may not change parameter 'allow_pickle'"):
        catalog.read_config(model, {**override, "parameters": {"allow_pickle": "true"}})
