"""Each model folder's state, as Triton's repository index shows it, with the reason a load failed.

A failed load's reason is the failure's own message on one line: a config error's, or the exception's type and
message (what an engine says names the file, the tensor and the fix). Paths inside the repository are shown
relative to it; the traceback goes to the server log only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.errors import ConfigError, SwitchyardError
from gateway.repository.layout import find_model_dir
from gateway.repository.registry import ModelRegistry

MAX_REASON_CHARS = 1000


@dataclass(frozen=True)
class ModelState:
    """READY, LOADING, UNLOADING or UNAVAILABLE (empty: never loaded), with why: a failed load's reason,
    'unloaded', or for a READY model a failed reload's."""

    state: str
    reason: str = ""


class ModelStates:
    """The states of the folders of the repository at `root`; `models`: what is loaded from it."""

    def __init__(self, root: Path, models: ModelRegistry) -> None:
        self.root = root
        self.models = models
        self._states: dict[str, ModelState] = {}

    def get(self, folder: str) -> ModelState:
        return self._states.get(folder, ModelState(""))

    def set(self, folder: str, state: str, reason: str = "") -> None:
        self._states[folder] = ModelState(state, reason)

    def failed(self, folder: str, serving: bool, exc: BaseException) -> str:
        """Record a failed load and return its reason: a copy still serving stays READY (with the reason),
        otherwise the folder is UNAVAILABLE."""
        reason = self.reason(exc)
        if serving:
            self.set(folder, "READY", f"reload failed, serving the previous copy: {reason}")
        else:
            self.set(folder, "UNAVAILABLE", reason)
        return reason

    def public(self, message: str) -> str:
        """An error for the network: one line, paths shown relative to the repository, bounded."""
        message = " ".join(message.split())
        for prefix in (str(self.root.resolve()), str(self.root)):
            message = message.replace(prefix + "/", "").replace(prefix, ".")
        return message[:MAX_REASON_CHARS]

    def reason(self, exc: BaseException) -> str:
        """Why a load failed, for the network: a config error's (or a Switchyard error's) message, or the
        exception's type and message."""
        if isinstance(exc, ConfigError):
            return self.public(str(exc))
        if isinstance(exc, SwitchyardError):
            return self.public(exc.message)
        kind = type(exc).__qualname__
        if type(exc).__module__ not in ("builtins", "__main__"):
            kind = f"{type(exc).__module__}.{kind}"
        message = str(exc).strip()
        return self.public(f"{kind}: {message}" if message else kind)

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every model folder with its state (a never-loaded model: its name only)."""
        rows: list[dict[str, str]] = []
        try:
            names = sorted({p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")})
        except OSError:
            names = []
        for name in names:
            try:
                model = find_model_dir(self.root, name)
            except (ValueError, ConfigError):
                continue
            if model is None:
                continue
            state = self.get(name)
            entry = self.models.in_folder(name)
            if entry is not None:
                reason = state.reason if state.state == "READY" else ""
                rows.extend(
                    {"name": name, "version": str(version), "state": "READY", "reason": reason}
                    for version in entry.versions
                )
            elif ready_only:
                continue
            elif state.state:
                rows.append({"name": name, "version": "", "state": state.state, "reason": state.reason})
            else:
                rows.append({"name": name})
        return rows
