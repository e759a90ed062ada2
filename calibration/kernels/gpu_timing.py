"""Timing of GPU calls: CUDA graphs of back-to-back calls, CUDA-event timing, median of repeats.

Engines replay their decode steps as CUDA graphs, so a call is timed inside a captured graph of
``n`` calls (launch gaps as in a graph, no Python in between). Calls rotate over several input
sets whose total size is several times the L2 cache, so small reads come from HBM, as KV reads
of a real decode step do. Falls back to an eager loop where capture fails.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

TARGET_REPLAY_S = 2e-3   # one timed replay covers at least this much work
MAX_CALLS_PER_REPLAY = 256


def _eager_estimate(calls: Sequence[Callable[[], object]], rounds: int = 3) -> float:
    for c in calls:
        c()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = len(calls) * rounds
    e0.record()
    for i in range(n):
        calls[i % len(calls)]()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / 1e3 / n


def time_calls(calls: Sequence[Callable[[], object]], repeats: int = 15,
               use_graph: bool = True, n_calls: int | None = None) -> dict:
    """Median, min and max seconds per call of ``calls`` (run in rotation).

    ``n_calls`` fixes the calls per replay (processes timing collectives together must agree
    on it); by default enough calls for ``TARGET_REPLAY_S``.
    Returns ``{"median_s", "min_s", "max_s", "calls_per_replay", "mode"}``.
    """
    if not calls:
        raise ValueError("no calls to time")
    est = _eager_estimate(calls)
    per = max(1, min(MAX_CALLS_PER_REPLAY, math.ceil(TARGET_REPLAY_S / max(est, 1e-7))))
    if n_calls is not None:
        per = n_calls
    n = max(per, len(calls))
    n = math.ceil(n / len(calls)) * len(calls)
    mode = "graph"
    replay: Callable[[], object]
    if use_graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for c in calls:
                    c()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(n):
                    calls[i % len(calls)]()
            replay = graph.replay
        except RuntimeError:
            torch.cuda.synchronize()
            use_graph = False
    if not use_graph:
        mode = "eager"

        def replay():
            for i in range(n):
                calls[i % len(calls)]()

    replay()
    replay()
    torch.cuda.synchronize()
    samples = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(repeats):
        e0.record()
        replay()
        e1.record()
        e1.synchronize()
        samples.append(e0.elapsed_time(e1) / 1e3 / n)
    return {"median_s": statistics.median(samples), "min_s": min(samples),
            "max_s": max(samples), "calls_per_replay": n, "mode": mode}


def host_call_overhead(repeats: int = 5, n: int = 2000) -> float:
    """Median host seconds per eager launch of a trivial kernel (queue kept full)."""
    x = torch.zeros(1, device="cuda")
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1.0)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)
