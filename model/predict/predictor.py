"""Predictions from a fitted ``CostModel``: the object that holds the caches.

``predictor_for(model)`` returns the one ``Predictor`` of a fitted model (kept while the model
lives). It stacks the engines' coefficients and covariances once and predicts every row of a
``Case`` in one pass: totals with 90 % intervals, prefill, TPOT, the seconds of each decode
term, how many sequences run at once and the KV capacity. An engine without calibration data
on a GPU type predicts with the engine's priors (``engine_advisor.model.fit.fitting.engine_prior``).
"""

from __future__ import annotations

import numpy as np

from engine_advisor.model.fit.costmodel import (
    TRANSFERRED_REL_SIGMA,
    UNCALIBRATED_REL_SIGMA,
    CostModel,
    Prediction,
)
from engine_advisor.model.fit.estimator import prior_vector
from engine_advisor.model.fit.fitting import engine_prior
from engine_advisor.model.formulas.layout import N_PREFILL
from engine_advisor.model.formulas.predict import (
    CAPACITY,
    FEASIBLE,
    PARTS,
    PREFILL_ALL,
    RUNNING,
    TOTAL,
    TOTAL_HI,
    TOTAL_LO,
    TPOT,
    TTFT,
    predict_rows,
)
from engine_advisor.model.hardware.gpus import GpuSpec
from engine_advisor.model.physics.features import (
    Case,
    QueryFacts,
    engine_index,
    kernel_inputs,
    split_by_kernels,
    static_rows,
)
from engine_advisor.model.physics.memory import MemoryChoice, choose_fraction
from engine_advisor.model.physics.scale import term_scale
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.physics.terms import TERMS
from engine_advisor.model.workload import Config

N_TERMS = len(TERMS)
# Added relative sd of a prediction by its calibration status: without data for its model
# (transferred) or hardware (uncalibrated); a calibrated one adds EXTRAPOLATION_REL_SIGMA per
# doubling outside its calibrated range (engine_advisor.model.predict.query.evaluate)
COVERAGE_REL_SIGMA = {"calibrated": 0.0, "transferred": TRANSFERRED_REL_SIGMA,
                      "uncalibrated": UNCALIBRATED_REL_SIGMA}
CROSSOVER_CACHE_SIZE = 1024
Z90 = 1.645          # a normal's 90 % two-sided quantile: the intervals' half-width in sd
FACTS_CACHE_SIZE = 1024



class Predictor:
    def __init__(self, model: CostModel):
        self.model = model
        self._levels: dict[str, tuple[np.ndarray, np.ndarray, float]] = {
            name: (est.coef_, est.coef_cov_, est.relative_noise_)
            for name, est in model.engines.items()}
        self._coef: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray, float]] = {}
        # the recommender's crossover scans
        # (engine_advisor.model.decision.crossover.crossover_near), per workload without its context
        # (emptied when full)
        self.crossovers: dict = {}
        self._memory: dict[tuple[str, str], MemoryChoice] = {}
        self._facts: dict[tuple, QueryFacts] = {}
        self._stacks: dict[tuple, tuple] = {}

    def memory(self, engine: str, gpu: str) -> MemoryChoice:
        """The memory fraction for ``engine`` on ``gpu``
        (``engine_advisor.model.physics.memory.choose_fraction`` on the fractions the calibration
        saw safe and unsafe)."""
        hit = self._memory.get((engine, gpu))
        if hit is None:
            hit = self._memory[(engine, gpu)] = choose_fraction(
                engine, gpu, **self.model.safe_fractions(engine, gpu))
        return hit

    def facts(self, gpu: GpuSpec, num_gpus: int, shape: ModelShape,
              configs: tuple[Config, ...]) -> QueryFacts:
        """What a query's configurations need that does not depend on the workload's sizes:
        engines, DCP sizes, memory fractions, memory layouts and calibrated ranges
        (memoised); its rows choose the engines' memory knobs for the workload."""
        key = (gpu.name, gpu.memory_bytes, num_gpus, shape.key, shape.kv_dtype,
               shape.weight_bytes, configs)
        model_key = shape.key
        hit = self._facts.get(key)
        if hit is None:
            if len(self._facts) >= FACTS_CACHE_SIZE:
                self._facts.clear()
            engines = [c.engine for c in configs]
            index = engine_index(engines)
            dcps = [float(c.dcp_size) for c in configs]
            fractions = [self.memory(c.engine, gpu.name).fraction for c in configs]
            ranges = [self.model.calibrated_range(c.engine, gpu.name, num_gpus, c.dcp_size,
                                                  model_key) for c in configs]
            per_config = [(c.engine, c.dcp_size, status == "calibrated",
                           status == "transferred", f, rng if status == "calibrated" else None,
                           COVERAGE_REL_SIGMA[status])
                          for c, f, (status, rng) in zip(configs, fractions, ranges,
                                                         strict=True)]
            hit = self._facts[key] = QueryFacts(
                engines, dcps, max(dcps, default=1.0), fractions, ranges,
                static_rows(index, fractions, dcps, shape, num_gpus, gpu.name, gpu.memory_bytes,
                            advise=True), index, per_config)
        return hit

    def stacked(self, engines: tuple[str, ...], gpu: str, shape: ModelShape, tp: int):
        """(coefficients of a case's feature columns (E, 2 x terms), covariance factors F
        (E, terms, rank) with cov = F F', relative noise (E,)) of engines on ``tp`` GPUs of a
        type for a served model."""
        key = (engines, gpu, shape.key, tp)
        hit = self._stacks.get(key)
        if hit is None:
            if len(self._stacks) >= FACTS_CACHE_SIZE:
                self._stacks.clear()
            coefs = [self.coefficients(e, gpu, shape, tp) for e in engines]
            factors = [_factor(c[1]) for c in coefs]
            rank = max(f.shape[1] for f in factors)
            stacked = np.zeros((len(coefs), N_TERMS, rank))
            for k, f in enumerate(factors):
                stacked[k, :, :f.shape[1]] = f
            coef = np.array([np.concatenate([c[0], c[0][:N_PREFILL], c[0][N_PREFILL:]])
                             for c in coefs])
            hit = self._stacks[key] = (coef, stacked, np.array([c[2] for c in coefs]))
        return hit

    def coefficients(self, engine: str, gpu: str, shape: ModelShape,
                     tp: int) -> tuple[np.ndarray, np.ndarray, float]:
        """(coef, covariance, relative noise) of an engine on ``tp`` GPUs of a type for a served
        model: the fitted level ``CostModel.level_for`` names (the GPU's own fit, else the
        engine's pooled over the GPUs of its family it was measured on,
        ``engine_advisor.model.fit.fitting``), else the physical priors; scaled by the engine's
        own counts and kernels for the model (``engine_advisor.model.physics.scale``: the kernels
        a decode step launches, the fused-MoE prefill kernel)."""
        key = (engine, gpu, shape.key, tp)
        hit = self._coef.get(key)
        if hit is None:
            level = self.model.level_for(engine, gpu, shape.key)
            k = len(TERMS)
            coef, cov, noise = (self._levels[level] if level is not None
                                else (prior_vector(engine_prior(engine, gpu)), np.zeros((k, k)),
                                      0.03))
            scale = np.ones(k)
            for t, factor in term_scale(engine, shape, gpu, tp):
                scale[t] = factor
            coef, cov = coef * scale, cov * np.outer(scale, scale)
            hit = self._coef[key] = (coef, cov, noise)
        return hit

    def table(self, case: Case, rel_extra: np.ndarray | None = None,
              z: float = Z90) -> np.ndarray:
        """The prediction table (n, ``engine_advisor.model.formulas.predict.N_TABLE``) of every
        row of a case: its features times its engine's efficiencies, with ``z``-sd intervals, its
        sequences at once, KV capacity, feasibility and decode terms
        (``engine_advisor.model.formulas.predict.predict_rows``)."""
        index = engine_index(case.engine)
        parts = split_by_kernels(case, index)
        n = len(case)
        if rel_extra is None:
            extra = np.zeros(n)
        elif isinstance(rel_extra, np.ndarray) and rel_extra.shape == (n,):
            extra = rel_extra.astype(float, copy=False)
        else:
            extra = np.ascontiguousarray(np.broadcast_to(rel_extra, (n,)), dtype=float)
        if len(parts) > 1:          # engines on kernels of their own: one pass per silicon
            done = [(self.table(sub, extra[rows], z), rows) for sub, rows in parts]
            out = np.empty((n, done[0][0].shape[1]))
            for t, rows in done:
                out[rows] = t
            return out
        case = parts[0][0]
        K, coll, curve, rows, (engines, idx) = kernel_inputs(case, index)
        coef, factors, noise = self.stacked(engines, case.silicon.name, case.shape, case.tp)
        return predict_rows(K, coll, curve, rows, coef, factors, noise, idx, extra, float(z))

    def predict(self, case: Case, rel_extra: np.ndarray | None = None,
                z: float = Z90) -> Prediction:
        """``table`` as named columns."""
        t = self.table(case, rel_extra, z)
        return Prediction(t[:, TOTAL], t[:, TOTAL_LO], t[:, TOTAL_HI], t[:, TTFT],
                          t[:, PREFILL_ALL], t[:, TPOT], t[:, PARTS:], t[:, RUNNING],
                          t[:, CAPACITY], t[:, FEASIBLE] > 0.0)


def _factor(cov: np.ndarray) -> np.ndarray:
    """F (terms, rank) with F F' = cov, from its eigenvectors (a bootstrap covariance is
    positive semi-definite and usually of low rank: eigenvalues below 1e-12 of the largest
    are dropped)."""
    w, U = np.linalg.eigh(cov)
    keep = w > max(float(w.max()), 0.0) * 1e-12
    return U[:, keep] * np.sqrt(w[keep])


def predictor_for(model: CostModel) -> Predictor:
    p = model.__dict__.get("_predictor")
    if p is None:
        p = model.__dict__["_predictor"] = Predictor(model)
    return p
