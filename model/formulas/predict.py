"""Features x an engine's fitted efficiencies: the prediction table of a case's rows
(``predict_into``; ``predict_rows`` from the rows, in one call) and its columns."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from engine_advisor.model.formulas.layout import (
    FIRST_PREFILL,
    N_DECODE,
    N_PREFILL,
    N_TERMS,
    STEP,
)
from engine_advisor.model.formulas.memory import N_FACTS
from engine_advisor.model.formulas.rows import rows_into

# Columns of a prediction table (predict_rows): the figures, the memory (``memory_fit``'s
# facts from RUNNING on), then each decode term's seconds
(TOTAL, TOTAL_LO, TOTAL_HI, TTFT, PREFILL_ALL, TPOT, RUNNING, CAPACITY, FEASIBLE, T_FITS_ALL,
 T_BINDS, T_KNOB, T_KNOB_RUNNING, T_SLOTS, T_RUN0, T_CAP0, T_BINDS0) = range(17)
PARTS = 17
N_TABLE = PARTS + N_DECODE


@njit(cache=True)
def predict_rows(K, coll, curve, rows, coef, factors, noise, engine, rel_extra, z):
    """The prediction table (n, N_TABLE) of a case's rows: ``rows_into`` then
    ``predict_into``, in one call (one recommendation pays one dispatch)."""
    n = rows.shape[1]
    X = np.empty((n, 2 * N_TERMS))
    facts = np.empty((N_FACTS, n))
    rows_into(K, coll, curve, rows, X, facts)
    out = np.empty((n, N_TABLE))
    predict_into(X, coef, factors, noise, engine, rel_extra, z, out)
    for i in range(n):
        for k in range(N_FACTS):
            out[i, RUNNING + k] = facts[k, i]
    return out


@njit(cache=True)
def predict_into(X, coef, factors, noise, engine, rel_extra, z, out):
    """Each row's prediction from its features ``X`` (``rows_into``) and its engine's fitted
    efficiencies: ``coef`` (engines, 2 x N_TERMS) the coefficients of X's columns, ``factors``
    (engines, N_TERMS, rank) with the coefficients' covariance = F F', ``noise`` (engines,) the
    relative residual sd, ``engine`` each row's index into them, ``rel_extra`` each row's added
    relative sd. Writes into ``out`` (n, N_TABLE) columns TOTAL ... TPOT: total, its ``z``-sd
    interval (low, high), the first wave's prefill (TTFT), all waves' prefill, one decode
    step; and from PARTS on the seconds of each term of that step."""
    rank = factors.shape[2]
    for i in range(X.shape[0]):
        e = engine[i]
        total = 0.0
        prefill_all = 0.0
        for j in range(N_TERMS):
            v = X[i, j] * coef[e, j]
            total += v
            if j < N_PREFILL:
                prefill_all += v
        ttft = 0.0
        for j in range(N_PREFILL):
            ttft += X[i, FIRST_PREFILL + j] * coef[e, FIRST_PREFILL + j]
        tpot = 0.0
        for j in range(N_DECODE):
            v = X[i, STEP + j] * coef[e, STEP + j]
            out[i, PARTS + j] = v
            tpot += v
        var = 0.0           # parameter variance x' cov x = |x' F|^2
        for r in range(rank):
            q = 0.0
            for j in range(N_TERMS):
                q += X[i, j] * factors[e, j, r]
            var += q * q
        rel = noise[e] + rel_extra[i]
        sd = math.sqrt(max(var, 0.0) + (rel * total) ** 2)
        out[i, TOTAL] = total
        out[i, TOTAL_LO] = max(total - z * sd, 0.0)
        out[i, TOTAL_HI] = total + z * sd
        out[i, TTFT] = ttft
        out[i, PREFILL_ALL] = prefill_all
        out[i, TPOT] = tpot
