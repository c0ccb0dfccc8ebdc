"""The catalog of the repository's model folders: which load at startup (as the control mode says), which load on
their first request and under which served name, how long each stays loaded (its keep-alive), and each folder's
config as a load reads it. Model control (`model_control.py`) loads what the catalog names; the on-demand loader
(`on_demand.py`) asks it which folder a request's name loads. Names that arrive over the network are checked before
the file system is touched (see `layout.find_model_dir`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from gateway.errors import ConfigError, InvalidRequestError, NotFoundError
from gateway.repository.layout import ModelDir, find_model_dir, scan_repository
from gateway.repository.lifecycle_config import FOREVER
from gateway.repository.model_config import AnyModelConfig, ModelConfig, parse_model_config, validate_model_config
from gateway.repository.tensor_config import TensorModelConfig

log = logging.getLogger("switchyard.repository")

ControlMode = Literal["none", "explicit", "poll", "on_demand"]
CATALOG_RESCAN_S = 2.0  # a request for an unknown name rescans the repository at most this often


class RepositoryCatalog:
    """The repository's model folders as model control and the on-demand loader read them. `public`: an error
    message as the network may see it (`ModelStates.public`)."""

    def __init__(
        self,
        root: Path,
        *,
        control_mode: ControlMode = "none",
        load_models: Iterable[str] = (),
        default_keep_alive: float = 300.0,
        public: Callable[[str], str] = str,
    ) -> None:
        self.root = root
        self.control_mode = control_mode
        self.load_models = list(load_models)  # explicit mode: loaded at startup; ["*"] = all
        self.default_keep_alive = default_keep_alive  # --keep-alive, of the models loaded on request
        self._public = public
        self._catalog: dict[str, str] = {}  # served name -> folder, of the models a request loads
        self._catalog_configs: dict[str, AnyModelConfig] = {}  # folder -> config, of those models
        self._catalog_scanned = float("-inf")

    # ------------------------------------------------------------------ startup

    def named_at_startup(self) -> bool:
        """Explicit mode with --load-model names: exactly those load at startup, whatever their configs say."""
        return self.control_mode == "explicit" and self.load_models != ["*"]

    def startup_models(self) -> list[ModelDir]:
        """The model folders to load at startup, as the control mode says."""
        if not self.root.is_dir():
            raise ConfigError(f"model repository '{self.root}' is not a directory; pass --model-repository DIR.")
        if self.named_at_startup():
            found = []
            for name in self.load_models:
                try:
                    model = find_model_dir(self.root, name)
                except ValueError as exc:
                    raise ConfigError(f"--load-model: {exc}.") from None
                if model is None:
                    raise ConfigError(
                        f"--load-model {name}: the repository '{self.root}' has no model folder '{name}' "
                        "with a config file; model names are folder names."
                    )
                found.append(model)
            return found
        found = scan_repository(self.root)
        if not found and self.control_mode == "none":
            raise ConfigError(
                f"model repository '{self.root}' holds no model (no <model>/config.yaml found); add one, "
                "or start with --model-control-mode=poll or explicit to add models later."
            )
        if not found:
            log.warning("model repository '%s' holds no model yet", self.root)
        return found

    def loads_at_startup(self, config: AnyModelConfig) -> bool:
        if config.load is not None:
            return config.load == "on_startup"
        return self.control_mode != "on_demand"

    def on_request(self, config: AnyModelConfig) -> bool:
        """Whether a request for this model loads it (on_demand mode, or the model's `load: on_request`)."""
        return self.control_mode == "on_demand" or config.load == "on_request"

    def keep_alive_for(self, config: AnyModelConfig, override: float | None = None) -> float:
        """A loaded model's keep-alive: a load's own, its config's, the server's for models loaded on request;
        models that Triton's modes load stay loaded (FOREVER)."""
        if override is not None:
            return override
        if config.keep_alive is not None:
            return config.keep_alive
        return self.default_keep_alive if self.on_request(config) else FOREVER

    # ------------------------------------------------------------------ folders by name (the repository API)

    def find(self, name: str) -> ModelDir:
        """The folder of a name from the network: 400 for a name that is not a model name, 404 for no such folder."""
        try:
            model = find_model_dir(self.root, name)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        except ConfigError as exc:
            raise InvalidRequestError(self._public(str(exc))) from None
        if model is None:
            raise NotFoundError(f"no model named '{name}' in the model repository")
        return model

    def read_config(self, model: ModelDir, override: dict[str, Any] | None = None) -> AnyModelConfig:
        """The folder's config, or a load request's override of it (which may not touch the weights' location)."""
        config = parse_model_config(model.config_path, model.name)
        if override is None:
            return config
        if "model" in override:
            raise ConfigError("a load request's config may not set 'model' (weights location); edit the file")
        weights = config.model
        on_disk = config.parameters.get("allow_pickle") if isinstance(config, TensorModelConfig) else None
        config = validate_model_config(
            override, f"{model.name}: load request config", model.name, tensor=model.config_path.suffix == ".pbtxt"
        )
        if isinstance(config, TensorModelConfig) and config.parameters.get("allow_pickle") != on_disk:
            raise ConfigError(
                "a load request's config may not change parameter 'allow_pickle' (loading a "
                "pickle runs code): set it in the model's config file"
            )
        return config.model_copy(update={"model": weights}) if type(weights) is type(config.model) else config

    def is_ensemble(self, name: str) -> bool:
        """Whether the folder holds an ensemble (loaded after the models it calls); False where it cannot tell."""
        try:
            model = find_model_dir(self.root, name)
            config = parse_model_config(model.config_path, name) if model is not None else None
        except (ConfigError, ValueError, OSError):
            return False
        return isinstance(config, TensorModelConfig) and config.resolved_backend == "ensemble"

    # ------------------------------------------------------------------ models that load on request

    def refresh(self) -> None:
        """Re-read which served names load on request, and from which folder (blocking: parses the configs)."""
        catalog: dict[str, str] = {}
        configs: dict[str, AnyModelConfig] = {}
        if self.root.is_dir():
            for model in scan_repository(self.root):
                try:
                    config = parse_model_config(model.config_path, model.name)
                except ConfigError:
                    continue  # its state says why once something tries to load it
                if self.on_request(config):
                    served = (config.served_model_name if isinstance(config, ModelConfig) else None) or model.name
                    catalog.setdefault(served, model.name)
                    configs[model.name] = config
        self._catalog, self._catalog_configs = catalog, configs
        self._catalog_scanned = time.monotonic()

    def requestable(self, name: str) -> str | None:
        """The folder a request for the served name `name` loads, or None (no such model, or it does not load on
        request). An unknown name rescans the repository, at most every CATALOG_RESCAN_S."""
        folder = self._catalog.get(name)
        if folder is None and time.monotonic() - self._catalog_scanned > CATALOG_RESCAN_S:
            try:
                self.refresh()
            except (ConfigError, OSError):
                return None
            folder = self._catalog.get(name)
        return folder

    def loads_on_request(self, folder: str) -> bool:
        """Whether the model folder loads on request (as last scanned): its keep-alive may be set by requests."""
        return folder in self._catalog_configs

    def on_request_models(self) -> dict[str, AnyModelConfig]:
        """Folder -> config of every model that loads on request (as last scanned)."""
        return dict(self._catalog_configs)

    def ensemble_steps(self, folder: str) -> list[str]:
        """The models an ensemble folder calls ([] for any other model)."""
        config = self._catalog_configs.get(folder)
        if isinstance(config, TensorModelConfig) and config.ensemble_scheduling is not None:
            return [step.model_name for step in config.ensemble_scheduling.step]
        return []
