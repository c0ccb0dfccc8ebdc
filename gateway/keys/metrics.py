"""/metrics for named keys: requests, errors, tokens and refusals since the process started.

Labels stay bounded: by model (and refusal reason) only, unless --key-metrics-by-key adds a `key` label (the key's
id), one series per key and model. The exact per-key figures are in /admin/usage whatever this setting.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.keys.service import KeyService
from gateway.keys.store import UsageCounts

TOKEN_KINDS = (("prompt", "prompt_tokens"), ("cached", "cached_tokens"), ("completion", "completion_tokens"))


class KeyUsageCollector(Collector):
    """The ledger's counts since start, read at scrape time (nothing is updated per request here)."""

    def __init__(self, service: KeyService, by_key: bool = False) -> None:
        self._service = service
        self._by_key = by_key

    def collect(self) -> Iterator[Metric]:
        ledger = self._service.ledger
        base = ["key", "model"] if self._by_key else ["model"]
        requests = CounterMetricFamily(
            "switchyard_key_requests", "Requests made with named API keys, by model", labels=base
        )
        errors = CounterMetricFamily(
            "switchyard_key_request_errors",
            "Requests made with named API keys that failed (status 400 or more)",
            labels=base,
        )
        tokens = CounterMetricFamily(
            "switchyard_key_tokens",
            "Tokens of requests made with named API keys, by kind (cached prompt tokens are also prompt tokens)",
            labels=[*base, "kind"],
        )
        grouped: dict[tuple[str, ...], UsageCounts] = {}
        for (key_id, model), counts in list(ledger.totals.items()):
            labels: tuple[str, ...] = (key_id, model) if self._by_key else (model,)
            grouped.setdefault(labels, UsageCounts()).add(counts)
        for labels, counts in sorted(grouped.items()):
            requests.add_metric(list(labels), counts.requests)
            errors.add_metric(list(labels), counts.errors)
            for kind, name in TOKEN_KINDS:
                tokens.add_metric([*labels, kind], getattr(counts, name))
        refused = CounterMetricFamily(
            "switchyard_key_refusals",
            "Requests of named API keys refused with 429, by "
            "reason (rate_limit: a per-minute limit; budget: the period's budget)",
            labels=["key", "reason"] if self._by_key else ["reason"],
        )
        by_reason: dict[tuple[str, ...], int] = {}
        for (key_id, reason), n in list(ledger.refusals.items()):
            labels = (key_id, reason) if self._by_key else (reason,)
            by_reason[labels] = by_reason.get(labels, 0) + n
        for labels, n in sorted(by_reason.items()):
            refused.add_metric(list(labels), n)
        yield from (requests, errors, tokens, refused)
