"""Live engine statistics and the Prometheus text exposition's pieces (each engine's names and
lines: ``engine_advisor.sim.engines``).

The scheduler updates plain counters and histograms (``observe(value, count)`` records ``count``
equal observations at once, so a decode step costs one call per running request, not per
token); ``SimEngine.render_metrics`` reads the live gauges from the engine core at scrape
time. Times are wall seconds as a client sees them (already scaled by --time-scale).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
               0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_BUCKETS = (0.01, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
               50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def lines(self, name: str, labels: str) -> list[str]:
        out, cum = [], 0
        for bound, c in zip(self.bounds, self.counts, strict=False):
            cum += c
            out.append(f'{name}_bucket{{{labels},le="{bound}"}} {cum}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum!r}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


class Stats:
    """Counters and histograms the scheduler updates."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.cached_prompt_tokens = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.tpot = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue = Histogram(E2E_BUCKETS)
        self.errors: dict[int, int] = {}
        self._samples: deque[tuple[float, int]] = deque(maxlen=64)

    def sample_throughput(self, now: float) -> None:
        """Record (time, generated tokens) at most every 50 ms for the throughput gauge."""
        if not self._samples or now - self._samples[-1][0] >= 0.05:
            self._samples.append((now, self.generation_tokens))

    def gen_throughput(self, now: float, window: float = 2.0) -> float:
        """Generated tokens per wall second over the last ``window`` seconds."""
        samples = [s for s in self._samples if now - s[0] <= window]
        if len(samples) < 2 and self._samples:
            samples = [self._samples[-1]]
        if not samples:
            return 0.0
        t0, n0 = samples[0]
        if now - t0 <= 0:
            return 0.0
        return (self.generation_tokens - n0) / max(now - t0, 0.05)


def gauge(out: list[str], name: str, labels: str, value: float, help_: str,
           kind: str = "gauge") -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")
    out.append(f"{name}{{{labels}}} {value!r}" if isinstance(value, float)
               else f"{name}{{{labels}}} {value}")


def histogram(out: list[str], name: str, labels: str, h: Histogram, help_: str) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} histogram")
    out.extend(h.lines(name, labels))
