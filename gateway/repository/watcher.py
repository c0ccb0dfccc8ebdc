"""Poll mode (`--model-control-mode=poll`): rescan the model repository and apply what changed.

Every `--repository-poll-secs` the watcher fingerprints each model folder (see `layout.folder_fingerprint`: config
files by content, other files by size and mtime) and compares with what model control last loaded:

* a new folder with a config file is loaded;
* a folder that disappeared (or lost its config file) is unloaded, after its in-flight requests finish;
* a folder whose files changed is reloaded: the new copy starts while the old one serves, then they swap; if the
  new copy fails to load, the old one keeps serving and the repository index gives the reason.

A change is applied once the folder has looked the same for two polls in a row, so a model still being copied
is not loaded half-written (Triton warns about exactly that; writing to a temporary folder and renaming it in is
still the safe way).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import Any

from gateway.errors import ConfigError
from gateway.repository.layout import folder_fingerprint, read_model_dir

log = logging.getLogger("switchyard.repository")


def scan_fingerprints(root: Path) -> dict[str, str]:
    """Folder name -> fingerprint for every folder of `root` holding a config file (blocking).

    A folder the layout refuses (two config files, a link leaving the repository, a bad name) gets a fingerprint
    of the refusal, so model control reports it once instead of on every poll; its files are not read."""
    if not root.is_dir():
        raise ConfigError(f"model repository '{root}' is not a directory (removed or unmounted?)")
    found: dict[str, str] = {}
    for child in sorted(root.iterdir()):
        if child.name.startswith(".") or not child.is_dir():
            continue
        try:
            model = read_model_dir(root, child)
        except ConfigError as exc:
            found[child.name] = "refused:" + hashlib.sha256(str(exc).encode()).hexdigest()
            continue
        except OSError:
            continue  # vanished while we looked; the next poll sees it as removed
        if model is not None:
            found[child.name] = folder_fingerprint(child)
    return found


class RepositoryWatcher:
    """The polling task; `poll()` is one rescan (tests call it directly)."""

    def __init__(self, control: Any, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError("the poll interval must be positive")
        self.control = control  # gateway.repository.model_control.ModelControl
        self.interval_s = interval_s
        self._seen: dict[str, str] = control.fingerprints()  # the previous scan (startup: what was loaded)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="repository-watcher")
            log.info("polling the model repository '%s' every %gs", self.control.root, self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll()
                failing = False
            except ConfigError as exc:
                if not failing:  # say it once, not every poll
                    log.error("repository poll skipped: %s", exc)
                failing = True
            except Exception:
                log.exception("repository poll failed")

    async def poll(self) -> tuple[dict[str, str], list[str]]:
        """Rescan once and apply the changes that have settled; returns (folders (re)loaded, folders unloaded)."""
        current = await asyncio.to_thread(scan_fingerprints, self.control.root)
        previous, self._seen = self._seen, current
        known = self.control.fingerprints()
        changed = {name: fp for name, fp in current.items() if known.get(name) != fp and previous.get(name) == fp}
        removed = [name for name in known if name not in current and name not in previous]
        if changed or removed:
            log.info(
                "model repository changed: %s",
                ", ".join([f"{n} (load)" for n in changed] + [f"{n} (unload)" for n in removed]),
            )
            await self.control.apply_changes(changed, removed)
        return changed, removed
