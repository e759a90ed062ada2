"""Prometheus metrics of one app (its own registry, so several apps can live in one process).

Labels stay bounded: route templates (or "unmatched"), known methods, status codes, engines.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

METHODS = {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"}


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "engine_advisor_http_requests", "HTTP requests by route template and status",
            ["method", "route", "status"], registry=self.registry)
        self.latency = Histogram(
            "engine_advisor_http_request_duration_seconds", "HTTP request latency",
            ["method", "route", "status"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.recommendations = Counter(
            "engine_advisor_recommendations", "recommendations returned, by engine and DCP size",
            ["engine", "dcp_size"], registry=self.registry)
        self.model_info = Gauge(
            "engine_advisor_model_info", "the loaded model (value 1)", ["version", "source"],
            registry=self.registry)
        self.reloads = Counter(
            "engine_advisor_model_reloads", "model reload attempts by result", ["result"],
            registry=self.registry)
        # (method, route, status) -> (counter, histogram): bounded like the labels themselves
        self._children: dict[tuple[str, str, int], tuple] = {}

    def set_model(self, version: str, source: str) -> None:
        self.model_info.clear()
        self.model_info.labels(version=version, source=source[-200:]).set(1)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        m = method if method in METHODS else "other"
        key = (m, route, status)
        pair = self._children.get(key)
        if pair is None:     # labels() costs microseconds: each label set is looked up once
            code = str(status)
            pair = self._children[key] = (self.requests.labels(m, route, code),
                                          self.latency.labels(m, route, code))
        pair[0].inc()
        pair[1].observe(seconds)
