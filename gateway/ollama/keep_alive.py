"""Ollama's `keep_alive`, honoured as far as this server's model lifecycle goes.

On Ollama, `keep_alive` says how long a model stays loaded after the request (a number of seconds or a Go duration
such as "5m"; negative: for ever; 0: unload now). Here models are loaded and unloaded by the model control mode
(gateway/repository/model_control.py), so:

* a model that loads on request (`--model-control-mode on_demand`, or its `load: on_request`) takes the request's
  keep_alive as its own from then on (lookup.py `acquire`; the residency manager unloads it once idle that long,
  right after the answer for 0, never for a negative value), as on Ollama; the rest of this list is about the
  models that Triton's modes load:
* any other value than 0 is checked and accepted: loaded models stay loaded until they are unloaded, which is what
  `expires_at` in /api/ps reports (Ollama's "for ever": about 292 years ahead);
* 0 unloads the model once the answer is sent, through the repository API's unload, when that API is open: in the
  `explicit` model control mode and for a caller with the admin key (the same rule as
  `POST /v2/repository/models/{name}/unload`). Otherwise the answer is given and the model stays loaded (logged).
  Ollama's unload request (an empty prompt or no messages, with keep_alive 0) gets a 403 that says why instead.
* the load request (an empty prompt or no messages) answers for a loaded model; in the `explicit` mode, with the
  admin key, it loads a model folder of that name that is not loaded.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re

from gateway.errors import InvalidRequestError, SwitchyardError
from gateway.keys.auth import Principal
from gateway.repository.layout import is_valid_model_name
from gateway.repository.loaded_model import LoadedModel
from gateway.repository.model_control import ModelControl

log = logging.getLogger("switchyard.ollama")

FOREVER = math.inf
# Go's time.ParseDuration: an optional sign, then decimal numbers each with a unit
_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_DURATION = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h))+")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)")
_TASKS: set[asyncio.Task[None]] = set()  # unloads under way (kept from the garbage collector)


def parse_keep_alive(value: float | int | str | None) -> float | None:
    """Seconds (`FOREVER` for a negative value), or None when the request has no keep_alive. A number in a string
    is seconds too (Go's durations need a unit; Ollama's environment variable reads both)."""
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return FOREVER if value < 0 else float(value)
    text = str(value).strip()
    if _NUMBER.fullmatch(text):  # "-1", "300": seconds, as OLLAMA_KEEP_ALIVE reads them
        return parse_keep_alive(float(text))
    if not _DURATION.fullmatch(text):
        raise InvalidRequestError(
            f'keep_alive: time: invalid duration "{text[:64]}" (use seconds, or a duration '
            'such as "5m" or "1h30m"; negative: keep loaded)',
            param="keep_alive",
        )
    seconds = sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(text))
    return FOREVER if text.startswith("-") and seconds > 0 else seconds


def control_refusal(control: ModelControl, principal: Principal) -> str | None:
    """Why this caller cannot load or unload models here, or None when it can."""
    if control.control_mode != "explicit":
        return (
            f"models stay loaded: the server's model control mode is '{control.control_mode}' (start it with "
            "--model-control-mode explicit and an admin key to load and unload models)"
        )
    if not principal.admin:
        return "loading and unloading models needs the admin key (send it as Authorization: Bearer <admin key>)"
    return None


async def load_folder(control: ModelControl, name: str, principal: Principal) -> LoadedModel | None:
    """The model folder `name` loaded for Ollama's load request, or None when this caller cannot load it."""
    if control_refusal(control, principal) is not None or not is_valid_model_name(name):
        return None
    try:
        return await control.load(name)
    except SwitchyardError as exc:
        if exc.status == 404:
            return None
        raise


async def unload_after(control: ModelControl, model: LoadedModel, principal: Principal) -> None:
    """keep_alive 0 on an answered request: unload the model in the background (the connection is free at once), or
    log why it stays."""
    refusal = control_refusal(control, principal)
    if refusal is not None:
        log.info("keep_alive 0 for model '%s': %s", model.name, refusal)
        return
    task = asyncio.create_task(_unload(control, model), name=f"ollama-unload-{model.name}")
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


async def _unload(control: ModelControl, model: LoadedModel) -> None:
    try:
        await control.unload(model.folder)
    except SwitchyardError as exc:
        log.warning("keep_alive 0: model '%s' was not unloaded: %s", model.name, exc.message)
