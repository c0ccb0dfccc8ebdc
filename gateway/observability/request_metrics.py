"""Per-request LLM metrics: one recorder per LLM model, fed by its scheduler's `generate`.

Every LLM request (/v1 chat and completions, v2 generate and infer over HTTP and gRPC) reaches its model through
`LLMScheduler.generate`, whatever the engine (native, vLLM, TensorRT-LLM, remote), so wrapping that one stream
(`LLMRequestStats.observe`) sees arrival, admission, each token and the finish for all of them. The scheduler adds
one call, `scheduled`, when a request leaves its queue. Numbers are plain ints and floats touched only on the event
loop (no locks); `metrics.py` reads them at scrape time. Triton's per-model counters go into the KServe
`ModelStats`, so `/v2/models/{m}/stats` and the `nv_*` metrics agree for LLMs as they do for tensor models.

Semantics follow vLLM: time to first token and end-to-end latency run from arrival; queue time from arrival to
admission; inter-token latency is observed once per output token after the first; prompt tokens count once a
request's first token is out (its prefill is done); every finished request counts in `finished` by its
finish_reason (a client that went away counts as "abort"). Each engine request counts, so `n>1` counts n.

The same token counts are charged to the caller's tokens-per-minute limit (`rate_limit.charge_tokens`), and to a
named key's limits, budget and usage (`keys.context.charge`), since this is the one place that sees every LLM token.
"""

from __future__ import annotations

import contextlib
import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from engines.types import GenerationOutput, GenerationRequest
from gateway.keys import context as key_context
from gateway.keys.rate_limit import charge_tokens
from gateway.observability import tracing
from gateway.observability.inference_stats import ModelStats, failure_reason

# vLLM's default buckets (vllm/v1/metrics/buckets.py), so dashboards built for vLLM read ours unchanged.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
INTER_TOKEN_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

clock = time.monotonic  # seconds; the schedulers' clock (request.arrival_time), replaceable in tests

# Triton's failure reason for a request that finished with an engine-side finish_reason.
_FINISH_FAILURES = {"error": "BACKEND", "abort": "OTHER"}


class Histogram:
    """A Prometheus-style histogram as plain numbers: one bisect and two additions per observation."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket (not cumulative); the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times  # `le` is inclusive, as in Prometheus
        self.sum += value * times

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> tuple[list[tuple[float, int]], float]:
        """(upper bound, cumulative count) pairs ending with +inf, and the sum; consistent even mid-update (the
        +inf count is the sum of the copied buckets, so it always equals the histogram's count)."""
        counts, total = list(self.counts), self.sum
        buckets, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            buckets.append((bound, running))
        return buckets, total


@dataclass
class _Timing:
    arrival: float
    scheduled: float | None = None


class LLMRequestStats:
    """One LLM model's request metrics (see the module docstring)."""

    def __init__(self) -> None:
        self.model_stats = ModelStats()  # Triton's counters (nv_*, /v2/models/{m}/stats)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.inter_token = Histogram(INTER_TOKEN_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue_time = Histogram(REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {}  # finish_reason -> requests
        self._timings: dict[str, _Timing] = {}  # requests in flight, by id

    def scheduled(self, request_id: str) -> None:
        """The scheduler admitted the request (its queue time ends); later calls (after a preemption) are ignored."""
        timing = self._timings.get(request_id)
        if timing is not None and timing.scheduled is None:
            timing.scheduled = clock()

    async def observe(
        self, request: GenerationRequest, updates: AsyncIterator[GenerationOutput]
    ) -> AsyncIterator[GenerationOutput]:
        """Pass `updates` (a scheduler's stream for `request`) through, recording the request's metrics.

        Closing the returned stream closes `updates`, so an early close still aborts the request."""
        if not request.arrival_time:
            request.arrival_time = clock()
        timing = _Timing(request.arrival_time)
        request_id = request.request_id
        if request_id not in self._timings:  # a duplicate id is refused by the scheduler; keep the original's
            self._timings[request_id] = timing
        tokens = 0  # output tokens seen so far
        cached = 0  # prompt tokens the engine found cached, as far as it has said
        last = 0.0  # when the latest token arrived
        done = False
        request.trace_headers = dict(request.trace_headers or tracing.incoming.get())
        trace = _open_trace(request) if tracing.enabled() else None
        first_token: float | None = None
        final: GenerationOutput | None = None
        prompt_counted = False
        try:
            async with contextlib.aclosing(updates):
                async for out in updates:
                    now = clock()
                    if timing.scheduled is None:  # a scheduler that did not say: it was admitted by now
                        timing.scheduled = now
                    if out.cached_prompt_tokens > cached:
                        cached = out.cached_prompt_tokens
                    total = max(tokens, out.completion_tokens or tokens + len(out.new_token_ids))
                    new = total - tokens
                    if new > 0:
                        if tokens == 0:
                            first_token = now
                            self.ttft.observe(now - timing.arrival)
                            prompt = out.prompt_tokens or len(request.prompt_token_ids)
                            self.prompt_tokens += prompt
                            charge_tokens(prompt)
                            key_context.charge(prompt=prompt)
                            prompt_counted = prompt > 0
                        else:
                            self.inter_token.observe((now - last) / new, new)
                        self.generation_tokens += new
                        charge_tokens(new)
                        key_context.charge(completion=new)
                        tokens, last = total, now
                    if out.finished:
                        if tokens and not prompt_counted and out.prompt_tokens:  # known only at the end (usage)
                            self.prompt_tokens += out.prompt_tokens
                            charge_tokens(out.prompt_tokens)
                            key_context.charge(prompt=out.prompt_tokens)
                        final = out
                        done = True
                        if cached and tokens:  # prompt tokens found in the cache (they were charged as prompt)
                            key_context.charge(cached=cached)
                        self._end(
                            timing, now, out.finish_reason or "stop", _FINISH_FAILURES.get(out.finish_reason or "")
                        )
                    yield out
                    if done:
                        return
            done = True  # the stream ended without a final update
            self._end(timing, clock(), "error", "OTHER")
        except BaseException as exc:
            if not done:
                done = True
                self._failed(timing, exc)
                if trace is not None:
                    _close_trace(trace, timing, first_token, tokens, None, exc)
                    trace = None
            raise
        finally:
            if trace is not None:
                _close_trace(trace, timing, first_token, tokens, final, None)
            if self._timings.get(request_id) is timing:
                del self._timings[request_id]

    def _failed(self, timing: _Timing, exc: BaseException) -> None:
        reason = failure_reason(exc)
        if reason == "CANCELED":  # the client went away: vLLM counts the request as finished by "abort"
            self._end(timing, clock(), "abort", reason)
        else:  # refused before it started (queue full, bad request, engine down): never ran, so only Triton counts it
            self.model_stats.record_failure(int((clock() - timing.arrival) * 1e9), reason)

    def _end(self, timing: _Timing, now: float, finish_reason: str, failure: str | None) -> None:
        self.finished[finish_reason] = self.finished.get(finish_reason, 0) + 1
        started = timing.scheduled if timing.scheduled is not None else now
        self.e2e.observe(now - timing.arrival)
        self.queue_time.observe(started - timing.arrival)
        total_ns = int((now - timing.arrival) * 1e9)
        if failure is not None:
            self.model_stats.record_failure(total_ns, failure)
            return
        stats = self.model_stats
        stats.success.add(total_ns)
        stats.queue.add(int((started - timing.arrival) * 1e9))
        stats.record_batch(1, 1, 0, int((now - started) * 1e9), 0)  # an LLM request is one inference, one execution


def _open_trace(request: GenerationRequest) -> tracing.RequestTrace:
    """The request's span; downstream (a remote upstream) gets it as the parent from now on."""
    sampling = request.sampling
    trace = tracing.RequestTrace(
        request.trace_headers,
        request.arrival_time,
        {
            "gen_ai.request.id": request.request_id,
            "gen_ai.request.max_tokens": sampling.max_tokens,
            "gen_ai.request.temperature": sampling.temperature,
            "gen_ai.request.top_p": sampling.top_p,
        },
    )
    request.trace_headers = trace.headers
    return trace


def _close_trace(
    trace: tracing.RequestTrace,
    timing: _Timing,
    first_token: float | None,
    tokens: int,
    final: GenerationOutput | None,
    exc: BaseException | None,
) -> None:
    end = clock()
    attributes: dict[str, object] = {"gen_ai.usage.output_tokens": tokens}
    error = None
    if final is not None:
        attributes["gen_ai.response.finish_reasons"] = [final.finish_reason or "stop"]
        attributes["gen_ai.usage.input_tokens"] = final.prompt_tokens
        attributes["gen_ai.usage.cached_input_tokens"] = final.cached_prompt_tokens
        error = final.error
    elif exc is not None:
        error = f"{exc.__class__.__name__}: {exc}"
    else:
        error = "the stream ended without a final update"
    try:
        trace.finish(timing.arrival, timing.scheduled, first_token, end, attributes, error)
    except Exception:  # a tracing bug must never fail a request
        tracing.log.exception("could not record the request's span")
