"""The routes' Prometheus metrics, read from `RouteStats` at scrape time (gateway/observability/metrics.py's way)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.routes.runner import Routes


class RouteCollector(Collector):
    def __init__(self, routes: Routes) -> None:
        self._routes = routes

    def collect(self) -> Iterator[Metric]:
        stats = self._routes.stats
        served = CounterMetricFamily(
            "switchyard_route_requests",
            "Routed requests answered, by route and the model that served them.",
            labels=["route", "model"],
        )
        for (route, model), n in sorted(stats.served.items()):
            served.add_metric([route, model], n)
        attempts = CounterMetricFamily(
            "switchyard_route_attempts",
            "Attempts on a route's models (first tries, retries and fallbacks).",
            labels=["route"],
        )
        for route, n in sorted(stats.attempts.items()):
            attempts.add_metric([route], n)
        retries = CounterMetricFamily(
            "switchyard_route_retries",
            "Retries on the same model, by the failure retried.",
            labels=["route", "model", "reason"],
        )
        for key, n in sorted(stats.retries.items()):
            retries.add_metric(list(key), n)
        fallbacks = CounterMetricFamily(
            "switchyard_route_fallbacks",
            "Fallbacks past a model, by its failure (connect, timeout, 429, 5xx, not_loaded).",
            labels=["route", "model", "reason"],
        )
        for key, n in sorted(stats.fallbacks.items()):
            fallbacks.add_metric(list(key), n)
        failed = CounterMetricFamily(
            "switchyard_route_failures",
            "Routed requests that no model could answer, by the last failure.",
            labels=["route", "reason"],
        )
        for pair, n in sorted(stats.failed.items()):
            failed.add_metric(list(pair), n)
        yield from (served, attempts, retries, fallbacks, failed)
