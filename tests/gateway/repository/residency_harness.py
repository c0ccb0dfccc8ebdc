"""Model control over real tiny python-backend models for the residency tests (test_on_demand.py,
test_resident_memory.py, test_idle_expiry.py, test_residency.py): a hand-moved clock, memory counted from given
sizes, and loads that can be slowed or held."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from gateway.repository.model_control import ModelControl
from tests.gateway.repository.tiny_models import write_tagger, x_input


class Clock:
    """The keep-alive and recency clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def repo_of(root: Path, *names: str, extra: str = "") -> Path:
    for name in names:
        folder = write_tagger(root, name, tag=name)
        if extra:
            config = folder / "config.yaml"
            config.write_text(config.read_text() + extra)
    return root


def control_of(
    repo: Path,
    clock: Clock,
    sizes: dict[str, int] | None = None,
    budget: int = 10**9,
    mode: str = "on_demand",
    peaks: dict[str, int] | None = None,
    rss: Callable[[], int] = lambda: 0,
    **kwargs,
) -> ModelControl:
    """Model control whose memory is counted from `sizes` (bytes per folder), whose loads peak at `peaks` (bytes
    per folder, by format) and whose RSS reads `rss` (0)."""
    estimate: Callable = lambda model, config: (sizes or {}).get(model.name, 0)  # noqa: E731
    peak: Callable = lambda model, config: (peaks or {}).get(model.name, 0)  # noqa: E731
    return ModelControl(
        repo,
        control_mode=mode,
        memory_budget=budget,
        keep_alive_s=60,
        drain_timeout_s=5,
        residency={"clock": clock, "rss": rss, "estimate": estimate, "peak": peak},
        **kwargs,
    )


async def start(control: ModelControl, started: list[ModelControl]) -> ModelControl:
    started.append(control)
    control.prepare()
    await control.start_all(control.load_all())
    return control


async def tag(control: ModelControl, name: str) -> str:
    model = await control.models.acquire(name)
    _, outputs = await model.tensor.infer([x_input()])
    return next(o for o in outputs if o.name == "TAG").array[0, 0].decode()


def count_builds(control: ModelControl, delay: float = 0.0, gate: threading.Event | None = None) -> list[str]:
    """Record each build (a load's blocking part), made slower by `delay` seconds so requests pile up, or held
    until the test sets `gate`."""
    builds: list[str] = []
    real = control._build

    def build(model, config):  # noqa: ANN001, ANN202
        builds.append(model.name)
        time.sleep(delay)
        if gate is not None:
            gate.wait(timeout=30)
        return real(model, config)

    control._build = build  # type: ignore[method-assign]
    return builds
