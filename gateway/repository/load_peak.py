"""The memory a model's load takes at its peak, reserved in the memory budget before the load starts.

Why: loading holds more than the loaded model keeps. The loader reads the weight files (their pages count in the
process's RSS while tensors are copied out of them) and may build a wider copy first: transformers dequantizes a
whole GGUF file to float32 before casting it to the served dtype. A model counted only by its resident bytes can
push the process past the budget while it loads (measured: a 1470 MiB peak under a 1200 MiB budget), which under
a container's limit is the OOM killer's.

The rule (docs/model-management.md): before a model that is not loaded loads, the residency manager reserves

    reservation = max(resident estimate, load peak)

where the load peak is what the last load of the same model folder was measured to take (the RSS's highest growth
while it loaded, sampled by `PeakWatch`), or, before any load of it was measured, the estimate by format:

* native engine, HF folder: the weights as held + the weight files (read while each tensor is copied);
* native engine, GGUF: the weights as held + the file + every tensor in float32 where the loader dequantizes the
  file (any dtype but float32 with fast kernels, whose blocks are served from the file as stored);
* tensor models: their files twice (read, then built);
* backends whose memory is in another process or machine (vLLM, remote upstreams): 0.

The KV pool is not part of the peak (it is allocated as requests use it) but is part of the resident estimate, hence
the max. Idle models are evicted for the reservation; once the model is loaded the reservation is released and the
model is counted at its measured resident bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType

from gateway.repository.layout import ModelDir, resolve_source
from gateway.repository.memory_budget import estimate_bytes, llm_bytes
from gateway.repository.model_config import AnyModelConfig, ModelConfig

SAMPLE_S = 0.02  # how often the RSS is read while a model loads


def load_peak_bytes(model: ModelDir, config: AnyModelConfig) -> int:
    """The bytes a load of `model` takes at its peak, by format, before any load of it was measured (blocking:
    reads file sizes and a GGUF header)."""
    if isinstance(config, ModelConfig):
        if config.backend != "pytorch":
            return 0
        parts = llm_bytes(resolve_source(model, config.model.source, "model.source"), config)
        return parts.weights + parts.files + parts.float32
    return 2 * estimate_bytes(model, config)


def reservation(estimated: int, peak: int, measured: int | None) -> int:
    """What to reserve before a load: the larger of the model's resident estimate and its load's peak, the peak
    measured at its last load where there was one (a real figure beats the format's estimate), else `peak`."""
    return max(estimated, measured if measured is not None else peak)


class PeakWatch:
    """Samples `rss` on a thread while a load runs (in a worker thread or on the event loop's): `growth` is the
    highest RSS seen less the RSS at the start."""

    def __init__(self, rss: Callable[[], int], every_s: float = SAMPLE_S) -> None:
        self.rss = rss
        self.every_s = every_s
        self.start = 0
        self.highest = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def growth(self) -> int:
        return max(0, self.highest - self.start)

    def _sample(self) -> None:
        self.highest = max(self.highest, self.rss())

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> PeakWatch:
        self.start = self.highest = self.rss()
        self._thread = threading.Thread(target=self._run, name="load-peak", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
