"""Predictions from a fitted ``CostModel``: the object that holds the caches.

``predictor_for(model)`` returns the one ``Predictor`` of a fitted model (kept while the model
lives). It stacks the engines' coefficients and covariances once and predicts every row of a
``Case`` in one pass: totals with 90 % intervals, prefill, TPOT, the seconds of each decode
term, how many sequences run at once and the KV capacity. An engine without calibration data
on a GPU type predicts with the physical priors (``model.estimator.PRIOR``).
"""

from __future__ import annotations

import math

import numpy as np

from model.costmodel import (
    Case,
    CostModel,
    Prediction,
    case_features,
    doublings_outside,
    efficiency_key,
)
from model.estimator import PRIOR
from model.memory import MemoryChoice, choose_fraction
from model.terms import N_PREFILL, TERMS
from model.workload import ENGINES

N_TERMS = len(TERMS)
CROSSOVER_CACHE_SIZE = 1024

PRIOR_COEF = np.array([PRIOR[t] for t in TERMS])


class Predictor:
    def __init__(self, model: CostModel):
        self.model = model
        self._coef: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
        for name, est in model.engines.items():
            self._coef[name] = (est.coef_, est.coef_cov_,
                                max(est.residual_rel_std_, est.noise_floor))
        # the recommender's crossover scans (model.recommend.crossover_near), per workload
        # without its context (emptied when full)
        self.crossovers: dict = {}
        self._memory: dict[tuple[str, str], MemoryChoice] = {}
        self._ranges: dict[tuple, tuple] = {}
        self._stacks: dict[tuple, tuple] = {}

    def memory(self, engine: str, gpu: str) -> MemoryChoice:
        """The memory fraction for ``engine`` on ``gpu`` (``model.memory.choose_fraction`` on
        the fractions the calibration saw safe and unsafe)."""
        hit = self._memory.get((engine, gpu))
        if hit is None:
            hit = self._memory[(engine, gpu)] = choose_fraction(
                engine, gpu, **self.model.safe_fractions(engine, gpu))
        return hit

    def coverage(self, engine: str, gpu: str, num_gpus: int, dcp: int, model_key: str,
                 values: dict[str, float]) -> tuple[str, float]:
        """``CostModel.coverage``, its range lookup memoised."""
        key = (engine, gpu, num_gpus, dcp, model_key)
        hit = self._ranges.get(key)
        if hit is None:
            hit = self._ranges[key] = self.model.calibrated_range(*key)
        status, rng = hit
        if status == "uncalibrated":
            return status, math.inf
        return status, doublings_outside(rng, values)

    def _stacked(self, engines: tuple[str, ...], gpu: str):
        """(coefficients twice per engine (E, 2 x terms), their column sums (E, 2 x terms, 4:
        see _SUMS), covariance factors F (E, terms, rank)
        with cov = F F' (None when every covariance is zero), relative noise (E,)) of engines
        on a GPU type."""
        key = (engines, gpu)
        hit = self._stacks.get(key)
        if hit is None:
            coefs = [self.coefficients(e, gpu) for e in engines]
            factors = [_factor(c[1]) for c in coefs]
            rank = max(f.shape[1] for f in factors)
            stacked = np.zeros((len(coefs), N_TERMS, rank))
            for k, f in enumerate(factors):
                stacked[k, :, :f.shape[1]] = f
            C2 = np.array([np.concatenate([c[0], c[0]]) for c in coefs])
            hit = self._stacks[key] = (C2, _SUMS[None, :, :] * C2[:, :, None],
                                       stacked if rank else None,
                                       np.array([c[2] for c in coefs]))
        return hit

    def coefficients(self, engine: str, gpu: str) -> tuple[np.ndarray, np.ndarray, float]:
        """(coef, covariance, relative noise) of an engine on a GPU type; the physical priors
        where the model has no data for that pair."""
        key = efficiency_key(engine, gpu)
        hit = self._coef.get(key)
        if hit is None:
            k = len(TERMS)
            hit = self._coef[key] = (PRIOR_COEF, np.zeros((k, k)), 0.03)
        return hit

    def predict(self, case: Case, rel_extra: np.ndarray | None = None,
                z: float = 1.645) -> Prediction:
        f = case_features(case)
        X = f.X
        n = len(X)
        Xt = X[:, :N_TERMS]
        engines, idx = _engine_index(case.engine)
        C2, S, factors, noise = self._stacked(engines, case.silicon.name)
        Xd = X[:, N_TERMS + N_PREFILL:]
        if len(engines) == 1:
            sums = X @ S[0]
            parts = Xd * C2[0, N_TERMS + N_PREFILL:]
        elif n <= 64:   # few rows: each row's coefficients gathered
            P = X * C2[idx]
            sums = P @ _SUMS
            parts = P[:, N_TERMS + N_PREFILL:]
        else:   # many: every engine's sums in one product, each row keeps its engine's
            every = (X @ S.transpose(1, 0, 2).reshape(2 * N_TERMS, -1)).reshape(n, len(C2), -1)
            sums = every[np.arange(n), idx]
            parts = Xd * C2[:, N_TERMS + N_PREFILL:][idx]
        if factors is not None:   # parameter variance: x' cov x = |x' F|^2 with cov = F F'
            Q = Xt @ factors                             # (engines, rows, rank)
            # (engines, rows); a matmul reduces the short last axis faster on many rows
            V = (Q * Q).sum(axis=-1) if n <= 64 else (Q * Q) @ np.ones(Q.shape[-1])
            var = V[idx, np.arange(n)] if len(engines) > 1 else V[0]
        else:
            var = 0.0
        rel = noise[idx]
        if rel_extra is not None:
            rel = rel + rel_extra
        total = sums[:, 0]
        sd = np.sqrt(np.maximum(var, 0.0) + (rel * total) ** 2)
        return Prediction(total, np.maximum(total - z * sd, 0.0), total + z * sd, sums[:, 2],
                          sums[:, 1], sums[:, 3], parts, f.running, f.capacity, f.feasible)


def _factor(cov: np.ndarray) -> np.ndarray:
    """F (terms, rank) with F F' = cov, from its eigenvectors (a bootstrap covariance is
    positive semi-definite and usually of low rank: eigenvalues below 1e-12 of the largest
    are dropped)."""
    w, U = np.linalg.eigh(cov)
    keep = w > max(float(w.max()), 0.0) * 1e-12
    return U[:, keep] * np.sqrt(w[keep])


def _engine_index(names) -> tuple[tuple[str, ...], np.ndarray | int]:
    """(the engines of a case's rows in order of appearance, each row's index into them)."""
    if not isinstance(names, np.ndarray):
        engines = tuple(dict.fromkeys(names))
        if len(engines) == 1:
            return engines, 0
        pos = {e: k for k, e in enumerate(engines)}
        return engines, np.array([pos[e] for e in names], dtype=np.intp)
    idx = np.full(len(names), -1, dtype=np.intp)
    engines: list[str] = []
    for e in ENGINES:                 # the usual names: no sort of the rows' names
        rows = names == e
        if rows.any():
            idx[rows] = len(engines)
            engines.append(e)
    if (idx < 0).any():
        for e in np.unique(names[idx < 0]).tolist():
            idx[names == e] = len(engines)
            engines.append(e)
    return tuple(engines), (0 if len(engines) == 1 else idx)


# Columns of a case's features (model.costmodel.Features.X) summed into: total, prefill of
# all waves, prefill of the first wave (TTFT), one decode step (TPOT)
_SUMS = np.zeros((2 * N_TERMS, 4))
_SUMS[:N_TERMS, 0] = 1.0
_SUMS[:N_PREFILL, 1] = 1.0
_SUMS[N_TERMS:N_TERMS + N_PREFILL, 2] = 1.0
_SUMS[N_TERMS + N_PREFILL:, 3] = 1.0


def predictor_for(model: CostModel) -> Predictor:
    p = model.__dict__.get("_predictor")
    if p is None:
        p = model.__dict__["_predictor"] = Predictor(model)
    return p
