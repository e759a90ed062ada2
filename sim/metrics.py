"""Live engine statistics and their Prometheus text exposition under each engine's names.

The scheduler updates plain counters and histograms (``observe(value, count)`` records ``count``
equal observations at once, so a decode step costs one call per running request, not per
token); ``render`` reads the live gauges from the engine core at scrape time. Times are wall
seconds as a client sees them (already scaled by --time-scale).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.engine import EngineCore

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


def _gauge(out: list[str], name: str, labels: str, value: float, help_: str,
           kind: str = "gauge") -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")
    out.append(f"{name}{{{labels}}} {value!r}" if isinstance(value, float)
               else f"{name}{{{labels}}} {value}")


def _histogram(out: list[str], name: str, labels: str, h: Histogram, help_: str) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} histogram")
    out.extend(h.lines(name, labels))


def render(core: EngineCore, engine: str, model_name: str, info: dict[str, str]) -> str:
    """The /metrics text of ``engine`` ('vllm' or 'sglang')."""
    s = core.stats
    now = time.monotonic()
    safe_name = model_name.replace("\\", "\\\\").replace('"', '\\"')
    labels = f'model_name="{safe_name}"'
    out: list[str] = []
    if engine == "vllm":
        labels += ',engine="0"'
        _gauge(out, "vllm:num_requests_running", labels, core.num_running,
               "Number of requests in model execution batches.")
        _gauge(out, "vllm:num_requests_waiting", labels, core.num_waiting,
               "Number of requests waiting to be processed.")
        _gauge(out, "vllm:kv_cache_usage_perc", labels, core.kv_usage(),
               "KV-cache usage. 1 means 100 percent usage.")
        _gauge(out, "vllm:gpu_cache_usage_perc", labels, core.kv_usage(),
               "GPU KV-cache usage (older name). 1 means 100 percent usage.")
        _gauge(out, "vllm:prompt_tokens_total", labels, s.prompt_tokens,
               "Number of prefill tokens processed.", "counter")
        _gauge(out, "vllm:generation_tokens_total", labels, s.generation_tokens,
               "Number of generation tokens processed.", "counter")
        _gauge(out, "vllm:prefix_cache_queries_total", labels, s.prompt_tokens,
               "Prefix cache queries, in terms of number of queried tokens.", "counter")
        _gauge(out, "vllm:prefix_cache_hits_total", labels, s.cached_prompt_tokens,
               "Prefix cache hits, in terms of number of cached tokens.", "counter")
        out.append("# HELP vllm:request_success_total Count of successfully processed requests.")
        out.append("# TYPE vllm:request_success_total counter")
        for reason, n in s.finished.items():
            out.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {n}')
        _histogram(out, "vllm:time_to_first_token_seconds", labels, s.ttft,
                   "Histogram of time to first token in seconds.")
        _histogram(out, "vllm:inter_token_latency_seconds", labels, s.itl,
                   "Histogram of inter-token latency in seconds.")
        _histogram(out, "vllm:e2e_request_latency_seconds", labels, s.e2e,
                   "Histogram of end to end request latency in seconds.")
        _histogram(out, "vllm:request_queue_time_seconds", labels, s.queue,
                   "Histogram of time spent in WAITING phase for request.")
        info_labels = ",".join(f'{k}="{v}"' for k, v in sorted(info.items()))
        out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
        out.append("# TYPE vllm:cache_config_info gauge")
        out.append(f"vllm:cache_config_info{{{labels},{info_labels}}} 1.0")
    else:
        _gauge(out, "sglang:num_running_reqs", labels, core.num_running,
               "The number of running requests.")
        _gauge(out, "sglang:num_queue_reqs", labels, core.num_waiting,
               "The number of requests in the waiting queue.")
        _gauge(out, "sglang:num_used_tokens", labels, core.kv_used_tokens(),
               "The number of used tokens.")
        _gauge(out, "sglang:token_usage", labels, core.kv_usage(), "The token usage.")
        _gauge(out, "sglang:gen_throughput", labels, s.gen_throughput(now),
               "The generation throughput (token/s).")
        hit = s.cached_prompt_tokens / s.prompt_tokens if s.prompt_tokens else 0.0
        _gauge(out, "sglang:cache_hit_rate", labels, float(hit), "The prefix cache hit rate.")
        _gauge(out, "sglang:prompt_tokens_total", labels, s.prompt_tokens,
               "Number of prefill tokens processed.", "counter")
        _gauge(out, "sglang:generation_tokens_total", labels, s.generation_tokens,
               "Number of generation tokens processed.", "counter")
        _gauge(out, "sglang:num_requests_total", labels, sum(s.finished.values()),
               "Number of requests processed.", "counter")
        _histogram(out, "sglang:time_to_first_token_seconds", labels, s.ttft,
                   "Histogram of time to first token in seconds.")
        _histogram(out, "sglang:time_per_output_token_seconds", labels, s.tpot,
                   "Histogram of time per output token in seconds.")
        _histogram(out, "sglang:inter_token_latency_seconds", labels, s.itl,
                   "Histogram of inter-token latency in seconds.")
        _histogram(out, "sglang:e2e_request_latency_seconds", labels, s.e2e,
                   "Histogram of End-to-end request latency in seconds")
    return "\n".join(out) + "\n"
