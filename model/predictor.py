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

N_TERMS = len(TERMS)

PRIOR_COEF = np.array([PRIOR[t] for t in TERMS])


class Predictor:
    def __init__(self, model: CostModel):
        self.model = model
        self._coef: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
        for name, est in model.engines.items():
            self._coef[name] = (est.coef_, est.coef_cov_,
                                max(est.residual_rel_std_, est.noise_floor))
        self.cache: dict = {}   # per-model memo for the recommender (see model.recommend)
        self._memory: dict[tuple[str, str], MemoryChoice] = {}
        self._ranges: dict[tuple, tuple] = {}

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
        names = case.engine
        engines = list(dict.fromkeys(names.tolist() if isinstance(names, np.ndarray)
                                     else names))
        coefs = [self.coefficients(e, case.silicon.name) for e in engines]
        if len(engines) == 1:
            coef, cov, noise = coefs[0]
            C = coef[None, :]
            var = ((Xt @ cov) * Xt).sum(axis=1) if cov.any() else np.zeros(n)
            rel = np.full(n, noise)
        else:
            idx = np.fromiter((engines.index(e) for e in names), dtype=np.intp, count=n) \
                if not isinstance(names, np.ndarray) else _engine_index(names, engines)
            C = np.array([c[0] for c in coefs])[idx]
            rel = np.array([c[2] for c in coefs])[idx]
            var = np.zeros(n)
            for k, (_, cov, _) in enumerate(coefs):
                if cov.any():
                    rows = idx == k
                    var[rows] = ((Xt[rows] @ cov) * Xt[rows]).sum(axis=1)
        total = (Xt * C).sum(axis=1)
        if rel_extra is not None:
            rel = rel + rel_extra
        sd = np.sqrt(np.maximum(var, 0.0) + (rel * total) ** 2)
        pf = X[:, N_TERMS:N_TERMS + N_PREFILL] * C[:, :N_PREFILL]
        prefill_all = (Xt[:, :N_PREFILL] * C[:, :N_PREFILL]).sum(axis=1)
        parts = X[:, N_TERMS + N_PREFILL:] * C[:, N_PREFILL:]
        return Prediction(total, np.maximum(total - z * sd, 0.0), total + z * sd,
                          pf.sum(axis=1), prefill_all, parts.sum(axis=1), parts, f.running,
                          f.capacity, f.feasible)


def _engine_index(names: np.ndarray, engines: list[str]) -> np.ndarray:
    idx = np.zeros(len(names), dtype=np.intp)
    for k, e in enumerate(engines[1:], start=1):
        idx[names == e] = k
    return idx


def predictor_for(model: CostModel) -> Predictor:
    p = model.__dict__.get("_predictor")
    if p is None:
        p = model.__dict__["_predictor"] = Predictor(model)
    return p
