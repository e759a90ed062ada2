"""Where the best configuration changes with context: the argmin of predicted totals over a
log-spaced grid of contexts, interpolated between grid points."""

from __future__ import annotations

import math

import numpy as np

from model.fit.costmodel import CostModel
from model.hardware.silicon import Silicon
from model.physics.shape import ModelShape
from model.predict.predictor import CROSSOVER_CACHE_SIZE, Predictor
from model.predict.query import total_curves
from model.workload import Config, Workload

CROSSOVER_RANGE = (1024, 4 * 1024 * 1024)
CROSSOVER_GRID = np.geomspace(*CROSSOVER_RANGE, 64)


def crossovers(contexts: np.ndarray, totals: np.ndarray) -> list[tuple[int, int, int]]:
    """Where the argmin of ``totals`` changes: (context, config index before, after)."""
    safe = np.where(np.isfinite(totals), totals, np.inf)
    usable = np.isfinite(safe).any(axis=0)
    best = np.argmin(safe, axis=0)
    flips = [i for i in np.nonzero(best[1:] != best[:-1])[0] if usable[i] and usable[i + 1]]
    found = []
    for i in flips:
        a, b = best[i], best[i + 1]
        d0 = safe[a, i] - safe[b, i]
        d1 = safe[a, i + 1] - safe[b, i + 1]
        lo, hi = math.log(contexts[i]), math.log(contexts[i + 1])
        if np.isfinite(d0) and np.isfinite(d1) and d0 != d1:
            t = d0 / (d0 - d1)
        else:  # one side runs out of memory between the two grid points
            t = 0.5
        found.append((int(round(math.exp(lo + t * (hi - lo)))), int(a), int(b)))
    return found


def crossover_near(pred: Predictor, w: Workload, shape: ModelShape, configs: list[Config],
                   si: Silicon) -> int | None:
    """The context nearest the workload's where the best of ``configs`` (ranked, the
    workload's best first) changes, or None.

    The scan over CROSSOVER_GRID does not depend on the workload's context: it is cached per
    (workload without its context, configs) in the model's predictor ``pred``; only a miss
    asks the predictor for the curves."""
    if len(configs) < 2:
        return None
    cache = pred.crossovers
    req = w.requirements
    # the workload's best first (equal totals elsewhere keep it best), then a fixed order
    configs = [configs[0], *sorted(configs[1:])]
    key = (shape.key, shape.kv_dtype, shape.weight_bytes, si, w.num_gpus, w.output_tokens,
           w.batch_size, req.prefix_reuse_share if req else 0.0, tuple(configs))
    found = cache.get(key)
    if found is None:
        if len(cache) >= CROSSOVER_CACHE_SIZE:
            cache.clear()
        model: CostModel = pred.model
        found = cache[key] = crossovers(CROSSOVER_GRID, total_curves(
            model, w, shape, configs, CROSSOVER_GRID, si))
    if len(found) < 2:
        return found[0][0] if found else None
    return min(found, key=lambda f: abs(math.log(f[0] / w.context_tokens)))[0]
