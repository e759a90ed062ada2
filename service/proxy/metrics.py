"""Prometheus metrics of the proxy, in the app's registry (service/metrics.py).

Labels stay bounded: engines, configured upstream names (removed again when a reload drops
an upstream), status codes, a few fixed reasons and methods.

The per-request counters are ``engine_advisor.service.metrics.Counts`` (plain dicts, exported at
scrape time); requests in flight are read from the upstreams at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine_advisor.service.metrics import Counts
from engine_advisor.service.proxy.breaker import STATE_VALUES

if TYPE_CHECKING:
    from engine_advisor.service.proxy.upstreams import Pools

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TPOT = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
RATIO = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
IN_FLIGHT = ("engine_advisor_proxy_upstream_in_flight", "requests in flight to the upstream")


class InFlight(Collector):
    """Requests in flight per configured upstream, read when scraped."""

    def __init__(self, pools: Callable[[], Pools | None], registry: CollectorRegistry):
        self.pools = pools
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(*IN_FLIGHT, labels=["upstream"])
        pools = self.pools()
        for u in pools.upstreams if pools is not None else ():
            family.add_metric([u.name], u.in_flight)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(*IN_FLIGHT, labels=["upstream"])


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry,
                 pools: Callable[[], Pools | None] = lambda: None):
        r = registry
        self.requests = Counts(
            "engine_advisor_proxy_requests", "proxied requests by engine, upstream and status "
            "(upstream 'none' when no upstream answered)", ["engine", "upstream", "status"],
            registry=r)
        self.retries = Counts(
            "engine_advisor_proxy_retries", "attempts retried on another upstream, by the "
            "upstream that failed and why", ["upstream", "reason"], registry=r)
        self.request_failures = Counts(
            "engine_advisor_proxy_request_failures", "requests that failed the same way on two "
            "upstreams: the request's own failure, counted against no breaker", ["reason",
                                                                                 "status"],
            registry=r)
        self.upstream_faults = Counts(
            "engine_advisor_proxy_upstream_faults", "answers that broke the protocol, by "
            "upstream and kind: invalid (a body or data line that is not JSON), idle (no byte "
            "for idle_s in an answer under way), unended (after [DONE] the response did not end "
            "cleanly within end_grace_s: its connection closed, the request counted as answered)",
            ["upstream", "reason"], registry=r)
        self.decisions = Counts(
            "engine_advisor_proxy_decisions", "routing decisions by engine and DCP size",
            ["engine", "dcp_size"], registry=r)
        self.token_counts = Counts(
            "engine_advisor_proxy_prompt_token_counts", "how prompt tokens were counted",
            ["method"], registry=r)
        self.counted: dict[str, list[float]] = {}     # method -> its token_counts cell
        self.counts_skipped = Counts(
            "engine_advisor_proxy_prompt_token_counts_skipped", "prompts the decision depended "
            "on routed by their estimate: tokens.max_concurrent counts were running",
            ["reason"], registry=r)
        self.breaker = Gauge(
            "engine_advisor_proxy_breaker_state", "circuit breaker (0 closed, 1 half-open, "
            "2 open)", ["upstream"], registry=r)
        self.healthy = Gauge(
            "engine_advisor_proxy_upstream_healthy", "1 when the upstream passes health checks",
            ["upstream"], registry=r)
        self.in_flight = InFlight(pools, r)
        self.ttft = Histogram(
            "engine_advisor_proxy_ttft_seconds", "observed time to first token (streaming)",
            ["engine"], buckets=LATENCY, registry=r)
        self.tpot = Histogram(
            "engine_advisor_proxy_tpot_seconds", "observed time per output token (streaming)",
            ["engine"], buckets=TPOT, registry=r)
        self.tpot_ratio = Histogram(
            "engine_advisor_proxy_tpot_observed_over_predicted", "observed / predicted TPOT "
            "(model drift: 1 is a perfect model)", ["engine"], buckets=RATIO, registry=r)
        self.reloads = Counter(
            "engine_advisor_proxy_upstream_reloads", "pools file reloads by result", ["result"],
            registry=r)
        self._names: set[str] = set()
        self._children: dict[tuple, object] = {}
        self._status: dict[tuple[str, str, int], tuple[str, str, str]] = {}

    def child(self, metric, *labels: str):
        """``metric.labels(*labels)``, remembered (labels() costs microseconds per call)."""
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def count(self, engine: str, upstream: str, status: int) -> None:
        key = self._status.get((engine, upstream, status))
        if key is None:
            key = self._status[(engine, upstream, status)] = (engine, upstream, str(status))
        self.requests.inc(key)

    def fault(self, upstream: str, reason: str) -> None:
        self.upstream_faults.inc((upstream, reason))

    def track(self, names: list[str]) -> None:
        """Export the upstreams of a (re)loaded pools file; forget dropped ones."""
        self._children.clear()
        for gone in self._names - set(names):
            for g in (self.breaker, self.healthy):
                try:
                    g.remove(gone)
                except KeyError:
                    pass
        self._names = set(names)

    def set_breaker(self, upstream: str, state: str) -> None:
        if upstream in self._names:
            self.child(self.breaker, upstream).set(STATE_VALUES[state])
