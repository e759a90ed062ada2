"""One query's configurations at its sizes in one compiled call (``evaluate_rows``): the
sizes written into its rows, the doublings outside each configuration's calibrated range, the
prediction table and the figures a configuration's prediction reports."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from engine_advisor.model.formulas.layout import N_DECODE
from engine_advisor.model.formulas.predict import (
    CAPACITY,
    FEASIBLE,
    PARTS,
    PREFILL_ALL,
    RUNNING,
    T_BINDS,
    T_BINDS0,
    T_CAP0,
    T_FITS_ALL,
    T_KNOB,
    T_KNOB_RUNNING,
    T_RUN0,
    T_SLOTS,
    TOTAL,
    TOTAL_HI,
    TOTAL_LO,
    TPOT,
    predict_rows,
)

# Columns of a query's evaluation (evaluate_rows): the figures a configuration's prediction
# reports, then each decode term's seconds
(E_TOTAL, E_LO, E_HI, E_PREFILL, E_DECODE, E_TPOT, E_RUNNING, E_CAPACITY, E_FITS, E_FEASIBLE,
 E_DOUBLINGS, E_BINDS, E_KNOB, E_KNOB_RUNNING, E_SLOTS, E_RUN0, E_CAP0, E_BINDS0) = range(18)
E_PARTS = 18
N_EVAL = E_PARTS + N_DECODE
MAX_TOKENS = 2.0 ** 62     # a capacity reported beyond this is reported as this


@njit(cache=True)
def evaluate_rows(K, coll, curve, static, batch, context, output, share, coef,
                  factors, noise, engine, sigma, bounds, per_doubling, z):
    """One query's configurations at its sizes
    (``engine_advisor.model.predict.query.Query.evaluate``), in one call: ``static`` (N_ROW_FIELDS,
    n) the rows without sizes (``static_rows``), ``share`` each row's cached prompt share; ``sigma``
    each row's added relative sd by calibration status, plus ``per_doubling`` per doubling of the
    sizes outside its calibrated range, ``bounds`` (n, 6): low and high of (context, batch, output)
    (0 and inf without a range). Returns (n, N_EVAL): total, its interval, all prefill, decode
    (total less prefill), TPOT, sequences at once (0 when none fits), KV capacity (at most
    MAX_TOKENS), whether the whole batch's KV fits, whether one sequence fits, doublings outside the
    calibrated range; then the decode step's terms."""
    n = static.shape[1]
    rows = static.copy()
    extra = np.empty(n)
    dists = np.empty(n)
    for i in range(n):
        rows[2, i] = batch
        rows[3, i] = context
        rows[4, i] = output
        rows[6, i] = share[i]
        dist = 0.0
        for k, v in enumerate((context, batch, output)):
            lo, hi = bounds[i, 2 * k], bounds[i, 2 * k + 1]
            if v > hi:
                dist += math.log2(v / hi)
            elif v < lo:
                dist += math.log2(lo / v)
        dists[i] = dist
        extra[i] = sigma[i] + per_doubling * dist
    t = predict_rows(K, coll, curve, rows, coef, factors, noise, engine, extra, z)
    out = np.empty((n, N_EVAL))
    for i in range(n):
        total, pf = t[i, TOTAL], t[i, PREFILL_ALL]
        ok = t[i, FEASIBLE] > 0.0
        cap = t[i, CAPACITY]
        out[i, E_TOTAL] = total
        out[i, E_LO] = t[i, TOTAL_LO]
        out[i, E_HI] = t[i, TOTAL_HI]
        out[i, E_PREFILL] = pf
        out[i, E_DECODE] = total - pf if total > pf else 0.0
        out[i, E_TPOT] = t[i, TPOT]
        out[i, E_RUNNING] = t[i, RUNNING] if ok else 0.0
        out[i, E_CAPACITY] = cap if cap < MAX_TOKENS else MAX_TOKENS
        out[i, E_FITS] = t[i, T_FITS_ALL]
        out[i, E_FEASIBLE] = 1.0 if ok else 0.0
        out[i, E_DOUBLINGS] = dists[i]
        out[i, E_BINDS] = t[i, T_BINDS]
        out[i, E_KNOB] = t[i, T_KNOB]
        out[i, E_KNOB_RUNNING] = t[i, T_KNOB_RUNNING]
        out[i, E_SLOTS] = t[i, T_SLOTS]
        out[i, E_RUN0] = t[i, T_RUN0] if ok else 0.0
        out[i, E_CAP0] = min(t[i, T_CAP0], MAX_TOKENS)
        out[i, E_BINDS0] = t[i, T_BINDS0]
        for j in range(N_DECODE):
            out[i, E_PARTS + j] = t[i, PARTS + j]
    return out
