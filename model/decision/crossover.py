"""Where the best configuration changes with context: over a log-spaced grid of contexts,
where the fastest configuration pulls ahead of the leader by more than the engines' tie margin,
placed where their curves cross."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from engine_advisor.model.predict.predictor import CROSSOVER_CACHE_SIZE
from engine_advisor.model.predict.query import Query, total_curves
from engine_advisor.model.workload import Config, Workload

CROSSOVER_RANGE = (1024, 4 * 1024 * 1024)
CROSSOVER_GRID = np.geomspace(*CROSSOVER_RANGE, 64)


# two configurations predicted within 5 % of each other tie (engine_advisor.model.validation)
TIE = 0.05


def crossovers(contexts: np.ndarray, totals: np.ndarray,
               margin: float = TIE) -> list[tuple[int, int, int]]:
    """Where the best of ``totals``' rows changes for real: (context, row before, row after).

    The row fastest at the first context where any fits leads until it is slower than the
    fastest row by more than ``margin`` (closer than that, the engines' measured efficiencies
    cannot tell two configurations apart: ``TIE``), or no longer fits; the fastest row then
    leads. The change is placed where the two curves cross, interpolated in log context
    between the last grid point of the old leader's lead at which it was at least as fast and
    the next; halfway where one side does not fit there. Rows that trade places within the
    margin make no crossover."""
    safe = np.where(np.isfinite(totals), totals, np.inf)
    usable = np.nonzero(np.isfinite(safe).any(axis=0))[0]
    if len(usable) == 0:
        return []
    best = np.argmin(safe, axis=0)
    lead, since = int(best[usable[0]]), int(usable[0])
    found = []
    for i in usable[1:]:
        b = int(best[i])
        if safe[lead, i] <= safe[b, i] * (1.0 + margin):
            continue
        # the leader was the fastest at ``since``: the curves cross in [since, i]
        j = i - 1
        while j > since and not safe[lead, j] <= safe[b, j]:
            j -= 1
        d0 = safe[lead, j] - safe[b, j]
        d1 = safe[lead, j + 1] - safe[b, j + 1]
        lo, hi = math.log(contexts[j]), math.log(contexts[j + 1])
        if np.isfinite(d0) and np.isfinite(d1) and d0 != d1:
            t = min(max(d0 / (d0 - d1), 0.0), 1.0)
        else:  # one side runs out of memory between the two grid points
            t = 0.5
        found.append((int(round(math.exp(lo + t * (hi - lo)))), lead, b))
        lead, since = b, int(i)
    return found


def engine_envelopes(totals: np.ndarray, engines: Sequence[str]) -> tuple[list[str], np.ndarray,
                                                                          np.ndarray]:
    """(the engines, sorted; each one's fastest total at each context, shape (engines,
    contexts); the row of ``totals`` that gives it): one curve per engine, at its best DCP
    size at each context."""
    names = sorted(set(engines))
    safe = np.where(np.isfinite(totals), totals, np.inf)
    rows = []
    for name in names:
        own = np.array([r for r, e in enumerate(engines) if e == name])
        rows.append(own[np.argmin(safe[own], axis=0)])
    rows = np.array(rows)
    return names, np.take_along_axis(totals, rows, axis=0), rows


def crossover_near(q: Query, w: Workload, configs: list[Config]) -> int | None:
    """The context nearest the workload's where the best engine (each at its best DCP size of
    ``configs``) changes for real (``crossovers``), or None.

    The scan over CROSSOVER_GRID does not depend on the workload's context: it is cached per
    (query ``q``, output and batch sizes, configs) in the model's predictor; only a miss asks
    the predictor for the curves."""
    engines = {c.engine for c in configs}
    if len(engines) < 2:
        return None
    cache = q.pred.crossovers
    key = (q, w.output_tokens, w.batch_size, frozenset(configs))
    found = cache.get(key)
    if found is None:
        if len(cache) >= CROSSOVER_CACHE_SIZE:
            cache.clear()
        configs = sorted(configs)
        totals = total_curves(q.pred.model, w, q.shape, configs, CROSSOVER_GRID, q.si)
        found = cache[key] = crossovers(
            CROSSOVER_GRID, engine_envelopes(totals, [c.engine for c in configs])[1])
    if len(found) < 2:
        return found[0][0] if found else None
    return min(found, key=lambda f: abs(math.log(f[0] / w.context_tokens)))[0]
