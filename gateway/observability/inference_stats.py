"""Per model-version inference statistics in Triton's shape (`/v2/models/{m}/stats`, gRPC ModelStatistics).

Durations are nanoseconds. A request's queue time runs from arrival to the start of its batch; its compute
time is its batch's backend call (Triton attributes the whole batch time to each request of the batch).
Failures also count by Triton's reason (REJECTED, CANCELED, BACKEND, OTHER) for `nv_inference_request_failure`.
Recorded on the event loop only; `gateway/observability/metrics.py` exports the same numbers as Triton's `nv_*` metrics.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import InternalError, RateLimitError

#: Triton's `reason` label values of nv_inference_request_failure.
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


def failure_reason(error: BaseException) -> str:
    """Triton's failure reason for an exception that ended a request."""
    if isinstance(error, RateLimitError):
        return "REJECTED"  # queue full
    if isinstance(error, (GeneratorExit, asyncio.CancelledError)):
        return "CANCELED"  # the client went away
    if isinstance(error, InternalError):
        return "BACKEND"
    return "OTHER"


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += max(0, ns)

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass
class ModelStats:
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    rate_limiter: Duration = field(default_factory=Duration)  # part of `queue`: waiting for the rate limiter
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    batches: dict[int, BatchStat] = field(default_factory=dict)
    fail_reasons: dict[str, int] = field(default_factory=dict)

    def record_failure(self, ns: int, reason: str = "OTHER") -> None:
        """A failed request that took `ns`; `reason` is one of FAILURE_REASONS."""
        self.fail.add(ns)
        self.fail_reasons[reason] = self.fail_reasons.get(reason, 0) + 1

    def record_batch(self, rows: int, requests: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """One backend call over `rows` rows from `requests` requests."""
        self.inference_count += rows
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)
        for duration, ns in (
            (self.compute_input, input_ns),
            (self.compute_infer, infer_ns),
            (self.compute_output, output_ns),
        ):
            duration.add(ns * requests, requests)
        stat = self.batches.setdefault(rows, BatchStat())
        stat.compute_input.add(input_ns)
        stat.compute_infer.add(infer_ns)
        stat.compute_output.add(output_ns)

    def as_dict(self, name: str, version: str) -> dict[str, Any]:
        """Triton's JSON for one entry of `model_stats`."""
        return {
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": {"count": 0, "ns": 0},
                "cache_miss": {"count": 0, "ns": 0},
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": stat.compute_input.as_dict(),
                    "compute_infer": stat.compute_infer.as_dict(),
                    "compute_output": stat.compute_output.as_dict(),
                }
                for size, stat in sorted(self.batches.items())
            ],
        }
