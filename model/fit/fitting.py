"""How ``CostModel.fit`` turns dataset rows into efficiencies: pooled, selected, held out.

The pooling has two levels per engine, and DCP > 1 apart:

- **engine x GPU family** (``vllm/@hopper``): every row of the engine on GPUs of one family
  (``engine_advisor.model.hardware.gpus.GPU_FAMILIES``: Hopper, Blackwell; the engines run the same
  kernels on a family's GPUs), starting from the physics priors
  (``engine_advisor.model.fit.estimator.PRIOR``). What an engine's implementation does there (its
  MoE kernels, its MLA decode path, its fixed costs) carries over from the GPUs it was measured on
  to the family's others. Another family starts from the priors.
- **engine x GPU** (``vllm/H200``): that GPU's rows, starting from the family level fitted on
  the family's *other* GPUs' rows (so a point is never part of its own prior). A GPU without
  rows uses its family's level.
- **DCP > 1**: the DCP terms (``dcp_read``, ``dcp_fixed``; ``dcp_comm`` is held at the silicon)
  move only on rows with DCP > 1, and the other decode terms only on rows without DCP: a DCP-8
  decode says nothing about the engine's decode at DCP 1. Prefill terms move on either (DCP
  splits decode attention only).

On each level ``engine_advisor.model.fit.estimator.select_terms`` frees a term only when that lowers
the leave-one-point-out error, so the fit is never worse than its prior on the points it is given.

Rows measured on random weights (``weights`` = dummy) route a decode batch's tokens as an engine's
random-weight router does, which need not be a trained model's: a routing diversity ``rho`` per
served model (``engine_advisor.model.formulas.terms.batch_terms``, ``choose_diversity``) is
chosen on a grid by the same held-out error and applied to those rows only. Predictions for real
checkpoints use 1. When ``rho`` < 1 the routed experts' decode efficiency cannot be told from
those rows (few experts, many tokens each say nothing about reading every expert once, which a
trained router makes a batch do), so ``moe`` stays at its prior on that level (``movable``):
what the rows show beyond the experts' bytes goes to the terms that hold for any routing, the MoE
calls' floor (``moe_fixed``) among them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine_advisor.model import engines
from engine_advisor.model.fit.dataset import Measurement
from engine_advisor.model.fit.estimator import (
    MIN_HELD_OUT_POINTS,
    PRIOR,
    EngineCostModel,
    held_out_error,
    interval_halfwidth,
    log_errors,
    prior_vector,
    select_terms,
)
from engine_advisor.model.fit.rows import row_case, row_shape
from engine_advisor.model.hardware.gpus import gpu_family
from engine_advisor.model.physics.features import case_features
from engine_advisor.model.physics.scale import term_scale
from engine_advisor.model.physics.terms import PREFILL_TERMS, TERMS

DCP_TERMS = ("dcp_read", "dcp_comm", "dcp_fixed")
QUANTITIES = ("total", "ttft", "step")
# routing diversity of a random-weight decode batch: the candidates (1 = a trained router)
DIVERSITY_GRID = (1.0, 0.5, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05, 0.03, 0.02, 0.01, 0.0)


def engine_prior(engine: str, gpu: str | None = None) -> dict[str, float]:
    """The prior an engine's fits start from on ``gpu`` (a GPU type or family; None: any): the
    physics priors (``PRIOR``), with the terms the engine's kernels were profiled on at what
    they measured (``engine_advisor.model.engines.base.Engine.kernel_priors``, and
    ``family_priors`` for the kernels it runs on one GPU family only); an engine no module
    registers starts from the physics."""
    known = engines.REGISTRY.get(engine)
    if known is None:
        return dict(PRIOR)
    family = dict(known.family_priors).get(gpu_family(gpu), ()) if gpu else ()
    return {**PRIOR, **dict(known.kernel_priors), **dict(family)}


def family_key(engine: str, gpu: str) -> str:
    """The family level of the pooling for an engine on a GPU type."""
    return f"{engine}/@{gpu_family(gpu)}"


@dataclass
class Observations:
    """Every measured time of some rows: features ``X`` (n, TERMS), value ``y``, the row
    (index into the rows) and quantity (index into QUANTITIES) it came from."""

    X: np.ndarray
    y: np.ndarray
    row: np.ndarray
    qty: np.ndarray

    def take(self, keep: np.ndarray) -> Observations:
        return Observations(self.X[keep], self.y[keep], self.row[keep], self.qty[keep])


# routing diversity per served model (``Measurement.model``) of an engine's random-weight rows;
# a model it does not name routes as a trained router does (1)
Diversity = Mapping[str, float]
TRAINED: Diversity = {}


def diversity_of(rho: Diversity, r: Measurement) -> float:
    """The routing diversity a row's decode batch is modelled at: its model's under ``rho`` on
    random weights, a trained router's (1) otherwise."""
    return rho.get(r.model, 1.0) if r.weights == "dummy" else 1.0


def observations(rows: Sequence[Measurement], rho: Diversity = TRAINED) -> Observations:
    """The fitted quantities of each row (``engine_advisor.model.fit.dataset.Measurement``): total,
    the batch's prefill (not where the batch queues), one decode step
    (``Measurement.decode_step``). ``rho`` gives the routing diversity of random-weight rows per
    model."""
    Xs, ys, rs, qs = [], [], [], []
    for i, r in enumerate(rows):
        case = row_case(r, diversity_of(rho, r))
        f = case_features(case)
        # the engine's own counts and kernels for this model (engine_advisor.model.physics.scale):
        # the kernels a decode step launches, the fused-MoE prefill kernel its experts run on
        scale = term_scale(r.engine, case.shape, r.gpu, r.num_gpus)
        step = r.decode_step
        # a batch that queues: its last first token waits for running sequences to finish,
        # so the measured ``ttft_s`` is not a prefill (its total still is the whole batch)
        ttft = r.ttft_s if f.running[0] >= r.batch_size else None
        for q, (X, val) in enumerate(((f.total, r.total_s), (f.prefill, ttft),
                                      (f.tpot, step))):
            if val is not None:
                x = X[0].copy()
                for t, factor in scale:
                    x[t] *= factor
                Xs.append(x)
                ys.append(val)
                rs.append(i)
                qs.append(q)
    if not Xs:
        return Observations(np.zeros((0, len(TERMS))), np.zeros(0), np.zeros(0, int),
                            np.zeros(0, int))
    return Observations(np.array(Xs), np.array(ys), np.array(rs), np.array(qs))


def point_key(r: Measurement) -> tuple:
    """One grid point: its repeats and memory fractions share it (and are held out together)."""
    return (r.engine, r.gpu, r.num_gpus, r.dcp_size, r.context_tokens, r.batch_size,
            r.output_tokens, r.kv_bytes_per_token, r.kv_shards, r.model, r.weights)


def movable(rows: Sequence[Measurement], rho: Diversity) -> tuple[str, ...]:
    """``candidates``, less ``moe`` when some rows route a batch at a diversity below a trained
    router's (module docstring)."""
    pool = candidates(rows)
    below = any(diversity_of(rho, r) < 1.0 for r in rows if routes(r))
    return tuple(t for t in pool if t != "moe") if below else pool


def candidates(rows: Sequence[Measurement]) -> tuple[str, ...]:
    """The terms rows may move: the DCP terms with DCP > 1 rows, the other decode terms with
    DCP-1 rows, the prefill terms with any (DCP splits only decode attention: both engines
    prefill the same way with it)."""
    has_dcp = any(r.dcp_size > 1 for r in rows)
    has_plain = any(r.dcp_size == 1 for r in rows)
    return tuple(t for t in TERMS if t in PREFILL_TERMS or (t in DCP_TERMS and has_dcp)
                 or (t not in DCP_TERMS and has_plain))


@dataclass
class LevelFit:
    estimator: EngineCostModel
    held_out: np.ndarray       # each observation's held-out prediction
    prior: np.ndarray          # each observation's prediction by the level's prior
    obs: Observations
    groups: np.ndarray
    score: float


def fit_level(rows: Sequence[Measurement], prior, rho: Diversity) -> LevelFit | None:
    obs = observations(rows, rho)
    if len(obs.y) == 0:
        return None
    groups = _groups(rows, obs)
    strata = [f"{rows[i].model}/{q}" for i, q in zip(obs.row, obs.qty, strict=True)]
    est, loo, base = select_terms(obs.X, obs.y, groups, prior, movable(rows, rho), strata=strata)
    # what the level may be used for (``CostModel.level_for``): the served models it saw, and
    # whether it held points out at all; a level of too few points reproduces them, and
    # nothing says that the terms it moved are the engine's rather than those points'
    est.models_ = sorted({row_shape(r).key for r in rows})
    est.transfers_ = bool(len(np.unique(groups)) >= MIN_HELD_OUT_POINTS)
    return LevelFit(est, loo, base, obs, groups, held_out_error(log_errors(loo, obs.y)))


def routes(r: Measurement) -> bool:
    """Whether a row's routing diversity can matter: a random-weight MoE row decoding a
    batch."""
    return bool(r.weights == "dummy" and r.batch_size > 1 and row_shape(r).n_experts)


def has_routing(rows: Sequence[Measurement]) -> bool:
    return any(routes(r) for r in rows)


# choose_diversity selects the terms again at this many of the best-scoring diversities
DIVERSITY_FINALISTS = 2


def choose_diversity(rows: Sequence[Measurement]) -> tuple[dict[str, float], LevelFit | None]:
    """Per served model with routing rows, the routing diversity with the lowest held-out
    error of the engine level (none when no row depends on it), and that level's fit. Each
    model's random router is its own: vLLM's random weights send DeepSeek-V2-Lite's batch to a
    few experts and spread Qwen3-30B-A3B's as a trained router would. The models are taken in
    turn, each candidate refitting the terms selected at diversity 1 with the other models at
    their choice so far (a selection per candidate would cost ten times as much); the
    ``DIVERSITY_FINALISTS`` best of the last model's candidates then select their own terms,
    and the best of those selections is kept. Neighbouring diversities can score alike yet
    select differently (on vLLM's H200 rows, 0 and 0.01 kept five and seven terms, 3.1 % and
    1.6 % held out), so the choice is made between selections, not between refits of one
    selection."""
    prior = engine_prior(rows[0].engine, rows[0].gpu) if rows else PRIOR
    first = fit_level(rows, prior, TRAINED)
    if first is None or not has_routing(rows):
        return {}, first
    free = first.estimator.free_
    chosen: dict[str, float] = {}
    scores: list = []
    for name in sorted({r.model for r in rows if routes(r)}):
        scores = []
        for rho in DIVERSITY_GRID:
            trial = {**chosen, name: rho}
            obs = observations(rows, trial)
            pool = movable(rows, trial)
            est = EngineCostModel(prior=prior, free=[t for t in free if t in pool])
            est.fit(obs.X, obs.y)
            loo = est.loo_predictions(obs.X, obs.y, _groups(rows, obs))
            scores.append((held_out_error(log_errors(loo, obs.y)), -rho, rho, trial))
        chosen = min(scores, key=lambda s: s[:3])[3]
    fits = []
    for _, _, rho, trial in sorted(scores, key=lambda s: s[:3])[:DIVERSITY_FINALISTS]:
        lf = first if all(v == 1.0 for v in trial.values()) else fit_level(rows, prior, trial)
        if lf is not None:
            fits.append((lf.score, -rho, rho, trial, lf))
    _, _, _, trial, lf = min(fits, key=lambda f: f[:3])
    return {k: v for k, v in trial.items() if v != 1.0}, lf


def _groups(rows: Sequence[Measurement], obs: Observations) -> np.ndarray:
    index: dict[tuple, int] = {}
    return np.array([index.setdefault(point_key(rows[i]), len(index)) for i in obs.row])


@dataclass
class EngineFit:
    """One engine's fitted levels: estimators by key (``engine/*``, ``engine/GPU``), the
    routing diversity of its random-weight rows per model, metrics by key, held-out records."""

    estimators: dict[str, EngineCostModel]
    diversity: dict[str, float]
    metrics: dict[str, dict]
    records: list[dict]


def fit_engine(engine: str, rows: Sequence[Measurement]) -> EngineFit:
    estimators: dict[str, EngineCostModel] = {}
    metrics: dict[str, dict] = {}
    records: list[dict] = []
    by_family: dict[str, list[Measurement]] = defaultdict(list)
    for r in rows:
        by_family[gpu_family(r.gpu)].append(r)
    # the diversity is chosen on the GPU families whose rows it changes (random-weight MoE rows
    # decoding a batch): other families' rows would only move the choice by their own misfit
    rho, _ = choose_diversity([r for frows in by_family.values() if has_routing(frows)
                               for r in frows] or rows)
    for family, frows in sorted(by_family.items()):
        start = engine_prior(engine, family)
        top = fit_level(frows, start, rho)
        if top is not None:
            _finish(top)
            key = f"{engine}/@{family}"
            estimators[key] = top.estimator
            metrics[key] = _metrics(top, frows)
        by_gpu: dict[str, list[Measurement]] = defaultdict(list)
        for r in frows:
            by_gpu[r.gpu].append(r)
        for gpu, grows in sorted(by_gpu.items()):
            others = [r for r in frows if r.gpu != gpu]
            parent = fit_level(others, start, rho) if others else None
            prior = parent.estimator.coef_ if parent is not None else prior_vector(start)
            lf = fit_level(grows, prior, rho)
            if lf is None:
                continue
            _finish(lf)
            key = f"{engine}/{gpu}"
            estimators[key] = lf.estimator
            metrics[key] = _metrics(lf, grows)
            physics = observations(grows).X @ prior_vector(start)   # uncalibrated
            for j in range(len(lf.obs.y)):
                r = grows[lf.obs.row[j]]
                records.append({
                    "engine": engine, "gpu": gpu, "model": r.model, "weights": r.weights,
                    "dcp_size": r.dcp_size, "context_tokens": r.context_tokens,
                    "batch_size": r.batch_size, "output_tokens": r.output_tokens,
                    "quantity": QUANTITIES[lf.obs.qty[j]], "measured": float(lf.obs.y[j]),
                    "held_out": float(lf.held_out[j]), "parent": float(lf.prior[j]),
                    "prior": float(physics[j])})
    return EngineFit(estimators, rho, metrics, records)


def _finish(lf: LevelFit) -> None:
    """The level's interval half-width from its held-out totals (all quantities when the
    level has fewer than 10 totals)."""
    err = log_errors(lf.held_out, lf.obs.y)
    totals = err[lf.obs.qty == 0]
    lf.estimator.interval_halfwidth_ = interval_halfwidth(totals if len(totals) >= 10 else err)


def _metrics(lf: LevelFit, rows: Sequence[Measurement]) -> dict:
    err = log_errors(lf.held_out, lf.obs.y)
    prior_err = log_errors(lf.prior, lf.obs.y)
    rel = np.abs(lf.held_out / lf.obs.y - 1.0)
    out: dict = {
        "n_points": len(np.unique(lf.groups)), "n_observations": int(len(lf.obs.y)),
        "residual_rel_std": lf.estimator.residual_rel_std_,
        "cv_mape": float(np.mean(rel)) if len(rel) else None,
        "held_out_median": float(np.median(rel)) if len(rel) else None,
        "prior_median": float(np.median(np.abs(lf.prior / lf.obs.y - 1.0))),
        "held_out_score": held_out_error(err), "prior_score": held_out_error(prior_err),
        "free": list(lf.estimator.free_),
        "interval_halfwidth": lf.estimator.interval_halfwidth_,
        "coverage": jackknife_coverage(err),
    }
    for q, name in enumerate(QUANTITIES):
        m = lf.obs.qty == q
        if m.any():
            out[f"held_out_median_{name}"] = float(np.median(rel[m]))
            out[f"prior_median_{name}"] = float(np.median(np.abs(lf.prior[m] / lf.obs.y[m]
                                                                 - 1.0)))
    return out


def jackknife_coverage(err: np.ndarray, coverage: float = 0.90) -> float | None:
    """The share of held-out errors inside the half-width computed from the *other* held-out
    errors: the coverage a new point can expect from ``interval_halfwidth``."""
    n = len(err)
    if n < 2:
        return None
    inside = 0
    for i in range(n):
        w = interval_halfwidth(np.delete(err, i), coverage)
        inside += err[i] <= w + 1e-12
    return inside / n
