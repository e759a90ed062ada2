"""Prometheus metrics of one app (its own registry, so several apps can live in one process).

Labels stay bounded: route templates (or "unmatched"), known methods, status codes, engines.

What is counted on every request (``Counts``, ``Latencies``) is kept in plain dicts and turned
into metric families when /metrics is scraped: ``Counter.labels(...).inc()`` and
``Histogram.observe`` cost microseconds each (a lock, several Python calls, a linear bucket
scan), a dict update a fraction of one. The HTTP request counter is the latency histogram's
own count per label set (``Observed``), so a request is one row update. Everything runs on the
event loop's thread, the scrape too, so the dicts need no lock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

METHODS = {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"}


class Counts(Collector):
    """A counter family ``name_total{labels}``: ``inc(values)`` with one value per label.
    Each label set's count is a one-element list, its ``cell``: a caller that counts the
    same label set on every request keeps the cell and adds to ``cell[0]`` (one object
    touched: no key built, no lookup, no call)."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str],
                 registry: CollectorRegistry | None = None):
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.values: dict[tuple[str, ...], list[float]] = {}
        if registry is not None:
            registry.register(self)

    def cell(self, values: tuple[str, ...]) -> list[float]:
        c = self.values.get(values)
        if c is None:
            c = self.values[values] = [0.0]
        return c

    def inc(self, values: tuple[str, ...], amount: float = 1.0) -> None:
        self.cell(values)[0] += amount

    def get(self, values: tuple[str, ...]) -> float:
        c = self.values.get(values)
        return c[0] if c is not None else 0.0

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for values, c in list(self.values.items()):
            family.add_metric(values, c[0])
        yield family

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, labels=self.labels)


class Latencies(Collector):
    """A histogram family: ``observe(values, seconds)``; buckets found by bisection."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str],
                 buckets: Sequence[float], registry: CollectorRegistry | None = None):
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.bounds = sorted(float(b) for b in buckets)
        self.names = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        # per label set: a count per bucket (the last one +Inf), then the sum
        self.values: dict[tuple[str, ...], list[float]] = {}
        if registry is not None:
            registry.register(self)

    def observe(self, values: tuple[str, ...], amount: float) -> None:
        self.add(self.row(values), amount)

    def add(self, row: list, amount: float) -> None:
        """One observation into a label set's ``row``."""
        row[bisect_left(self.bounds, amount)] += 1
        row[-1] += amount

    def row(self, values: tuple[str, ...]) -> list:
        """The counts of a label set (a count per bucket, the last one +Inf, then the sum),
        for a caller that keeps it to ``add`` to."""
        row = self.values.get(values)
        if row is None:
            row = self.values[values] = [0] * (len(self.bounds) + 1) + [0.0]
        return row

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for values, row in list(self.values.items()):
            cumulative, total = [], 0
            for name, n in zip(self.names, row[:-1], strict=True):
                total += n
                cumulative.append((name, total))
            family.add_metric(values, cumulative, sum_value=row[-1])
        yield family

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labels)


class Observed(Collector):
    """A counter family ``name_total{labels}`` of the observations of a ``Latencies``: its
    count per label set, summed when scraped (nothing to update per request)."""

    def __init__(self, name: str, documentation: str, of: Latencies,
                 registry: CollectorRegistry | None = None):
        self.name, self.documentation, self.of = name, documentation, of
        if registry is not None:
            registry.register(self)

    def get(self, values: tuple[str, ...]) -> float:
        row = self.of.values.get(values)
        return float(sum(row[:-1])) if row is not None else 0.0

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.of.labels)
        for values, row in list(self.of.values.items()):
            family.add_metric(values, float(sum(row[:-1])))
        yield family

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, labels=self.of.labels)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.latency = Latencies(
            "engine_advisor_http_request_duration_seconds", "HTTP request latency",
            ["method", "route", "status"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.requests = Observed(      # the histogram's counts: one update per request
            "engine_advisor_http_requests", "HTTP requests by route template and status",
            self.latency, registry=self.registry)
        self.registry.register(self.latency)
        self.recommendations = Counts(
            "engine_advisor_recommendations", "recommendations returned, by engine and DCP size",
            ["engine", "dcp_size"], registry=self.registry)
        self.model_info = Gauge(
            "engine_advisor_model_info", "the loaded model (value 1)", ["version", "source"],
            registry=self.registry)
        self.reloads = Counter(
            "engine_advisor_model_reloads", "model reload attempts by result", ["result"],
            registry=self.registry)
        self.refusals = Counts(
            "engine_advisor_http_refusals", "connections and requests the front door refused "
            "or closed (engine_advisor.service.frontdoor), by reason", ["reason"],
            registry=self.registry)
        # (method, route, status) -> its latency row: bounded like the labels themselves
        self._rows: dict[tuple[str, str, int], list] = {}

    def set_model(self, version: str, source: str) -> None:
        self.model_info.clear()
        self.model_info.labels(version=version, source=source[-200:]).set(1)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        """One request: its latency, and so its count (``requests``)."""
        row = self._rows.get((method, route, status))
        if row is None:
            m = method if method in METHODS else "other"
            row = self._rows[(method, route, status)] = self.latency.row(
                (m, route, str(status)))
        self.latency.add(row, seconds)
