"""The hardware's cost of one call: reading bytes on a read curve (``read_s``,
``engine_advisor.model.hardware.profiles``) and one collective (``collective_s``,
``engine_advisor.model.hardware.silicon.Collective``); ``read_many`` and ``collective_many``
evaluate them over an array."""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def read_s(x: float, curve: np.ndarray, t0: float, asym: float, bps: float) -> float:
    """Seconds of one call reading ``x`` bytes on a read curve given as ``curve`` (4, m): knot
    bytes, seconds and their logs (``ReadCurve.table``), or, with no knots, ``x / bps``."""
    m = curve.shape[1]
    if m == 0:
        return x / bps
    if x < curve[0, 0]:
        return t0 + (curve[1, 0] - t0) * (x if x > 0.0 else 0.0) / curve[0, 0]
    if x > curve[0, m - 1]:
        return curve[1, m - 1] + (x - curve[0, m - 1]) / asym
    if m == 1:
        return curve[1, 0]
    lx = math.log(x)
    lo, hi = 0, m - 1           # the first knot with log bytes >= lx (binary search)
    while lo < hi:
        mid = (lo + hi) // 2
        if curve[2, mid] < lx:
            lo = mid + 1
        else:
            hi = mid
    i = lo
    if curve[2, i] == lx:
        return curve[1, i]
    return math.exp(curve[3, i - 1] + (lx - curve[2, i - 1]) * (curve[3, i] - curve[3, i - 1])
                    / (curve[2, i] - curve[2, i - 1]))


@njit(cache=True)
def read_many(x: np.ndarray, curve: np.ndarray, t0: float, asym: float,
               bps: float) -> np.ndarray:
    out = np.empty(x.shape[0])
    for i in range(x.shape[0]):
        out[i] = read_s(x[i], curve, t0, asym, bps)
    return out


@njit(cache=True, inline="always")
def collective_s(nbytes: float, table: np.ndarray, k: int) -> float:
    """Seconds of one collective of ``nbytes`` per rank whose parameters are row ``k`` of
    ``table``, a stack of ``Collective.params``: (latency, bandwidth, factor, small_max,
    small_latency, small_bandwidth)."""
    if table[k, 2] == 0.0:
        return 0.0
    if nbytes <= table[k, 3]:
        return table[k, 4] + nbytes / table[k, 5]
    return table[k, 0] + nbytes * (table[k, 2] / table[k, 1])


@njit(cache=True)
def collective_many(nbytes: np.ndarray, table: np.ndarray, k: int) -> np.ndarray:
    out = np.empty(nbytes.shape[0])
    for i in range(nbytes.shape[0]):
        out[i] = collective_s(nbytes[i], table, k)
    return out
