"""Predictions from a fitted ``CostModel``: the object that holds the caches.

``predictor_for(model)`` returns the one ``Predictor`` of a fitted model (kept while the model
lives). It stacks the engines' coefficients and covariances once and predicts every row of a
``Case`` in one pass: totals with 90 % intervals, prefill, TPOT, the seconds of each decode
term, how many sequences run at once and the KV capacity. An engine without calibration data
on a GPU type predicts with the physical priors (``model.estimator.PRIOR``).
"""

from __future__ import annotations

import weakref

import numpy as np

from model.costmodel import Case, CostModel, Prediction, case_features, efficiency_key
from model.estimator import PRIOR
from model.terms import N_PREFILL, TERMS

_PREDICTORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
PRIOR_COEF = np.array([PRIOR[t] for t in TERMS])


class Predictor:
    def __init__(self, model: CostModel):
        self.model = model
        self._coef: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
        for name, est in model.engines.items():
            self._coef[name] = (est.coef_, est.coef_cov_,
                                max(est.residual_rel_std_, est.noise_floor))
        self.cache: dict = {}   # per-model memo for the recommender (see model.recommend)

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
        n = len(case.batch)
        C = np.empty((n, len(TERMS)))
        var = np.empty(n)
        rel = np.empty(n)
        total = np.empty(n)
        names = set(case.engine.tolist())
        for engine in names:
            rows = case.engine == engine if len(names) > 1 else slice(None)
            coef, cov, noise = self.coefficients(engine, case.silicon.name)
            C[rows] = coef
            Xt = f.total[rows]
            total[rows] = Xt @ coef
            var[rows] = np.einsum("ij,jk,ik->i", Xt, cov, Xt)
            rel[rows] = noise
        if rel_extra is not None:
            rel = rel + rel_extra
        sd = np.sqrt(np.maximum(var, 0.0) + (rel * total) ** 2)
        prefill = np.einsum("ij,ij->i", f.prefill, C)
        prefill_all = np.einsum("ij,ij->i", f.total[:, :N_PREFILL], C[:, :N_PREFILL])
        parts = f.tpot[:, N_PREFILL:] * C[:, N_PREFILL:]
        return Prediction(total, np.maximum(total - z * sd, 0.0), total + z * sd, prefill,
                          prefill_all, parts.sum(axis=1), parts, f.running, f.capacity, f.feasible)


def predictor_for(model: CostModel) -> Predictor:
    p = _PREDICTORS.get(model)
    if p is None:
        p = _PREDICTORS[model] = Predictor(model)
    return p
