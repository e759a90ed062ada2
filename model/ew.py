"""Elementwise math on Python floats or numpy arrays: one formula, two evaluation modes.

The cost model's formulas (``model.terms``, ``model.memory``, ``model.silicon``) are written once
with these helpers and plain operators. Given numpy arrays they evaluate a whole grid in one
pass (capacity sweeps, training); given Python floats they evaluate one row without numpy's
per-call overhead (about a microsecond per ufunc on a small array, against tens of
nanoseconds per float operation), which is what one recommendation of a few configurations
needs.
"""

from __future__ import annotations

import math

import numpy as np

_ARRAY = np.ndarray


def is_array(*xs) -> bool:
    for x in xs:
        if isinstance(x, _ARRAY):
            return True
    return False


def maximum(a, b):
    if isinstance(a, _ARRAY) or isinstance(b, _ARRAY):
        return np.maximum(a, b)
    return a if a >= b else b


def floor(x):
    return np.floor(x) if isinstance(x, _ARRAY) else float(math.floor(x))


def ceil(x):
    return np.ceil(x) if isinstance(x, _ARRAY) else float(math.ceil(x))


def where(cond, a, b):
    if isinstance(cond, _ARRAY) or isinstance(a, _ARRAY) or isinstance(b, _ARRAY):
        return np.where(cond, a, b)
    return a if cond else b


def clip(x, lo, hi):
    if isinstance(x, _ARRAY) or isinstance(lo, _ARRAY) or isinstance(hi, _ARRAY):
        return np.clip(x, lo, hi)
    return lo if x < lo else hi if x > hi else x


def distinct(x: np.ndarray) -> list[float]:
    """The distinct values of an array of group sizes (small non-negative integers, stored as
    floats): a counting pass instead of a sort."""
    if x.size and x.min() >= 0 and x.max() <= 65536 and np.all(x == np.floor(x)):
        return np.flatnonzero(np.bincount(x.astype(np.intp).ravel())).astype(float).tolist()
    return np.unique(x).tolist()
