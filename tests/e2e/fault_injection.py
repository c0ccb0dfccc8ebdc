"""`python -m tests.e2e.fault_injection serve ...`: the real server, with faults planted in one request's own work.

A failure inside one row of a batch cannot be provoked from outside once the code is right (that is the point), so
tests that check its containment plant one: a request with seed `SAMPLING_FAULT_SEED` raises in the engine's
sampler (the step's worker thread) at its third token; one with the stop string `OUTPUT_FAULT_STOP` raises in
output processing (stop strings and detokenization, on the event loop) at its third token. Everything else is the
server as shipped.
"""

from __future__ import annotations

from typing import Any

from engines.pytorch import sampler
from gateway.cli import main
from gateway.scheduler.llm.output_processor import OutputProcessor

SAMPLING_FAULT_SEED = 1313
OUTPUT_FAULT_STOP = "<<boom>>"

_sample_row = sampler._sample_row
_add_token = OutputProcessor.add_token


def _faulty_sample_row(row: Any, step: Any, eos_token_ids: Any, generator: Any) -> Any:
    if step.sampling.seed == SAMPLING_FAULT_SEED and step.num_output_tokens >= 2:
        raise RuntimeError("planted sampling fault")
    return _sample_row(row, step, eos_token_ids, generator)


def _faulty_add_token(self: OutputProcessor, token: int, max_total_reached: bool = False) -> str:
    if OUTPUT_FAULT_STOP in self._params.stop and self.num_tokens >= 2:
        raise RuntimeError("planted output-processing fault")
    return _add_token(self, token, max_total_reached)


sampler._sample_row = _faulty_sample_row
OutputProcessor.add_token = _faulty_add_token  # type: ignore[method-assign]

if __name__ == "__main__":
    raise SystemExit(main())
