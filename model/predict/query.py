"""A workload as a query: the configurations it allows, their rows, and every configuration's
prediction at the workload's sizes.

``candidates`` applies the engines' DCP rules and the workload's requirements
(``model.predict.capabilities``); ``build_case`` is the one place a query's rows are built;
``evaluate`` predicts them (``model.predict.predictor``) with intervals widened by how far the
workload lies from calibration data (``coverage``) and says which may be recommended.
"""

from __future__ import annotations

import math
from functools import lru_cache, partial
from typing import NamedTuple

import numpy as np

from model import engines
from model.engines import effective_share
from model.fit.costmodel import (
    EXTRAPOLATION_REL_SIGMA,
    CostModel,
)
from model.formulas import FEASIBLE, N_TABLE, PARTS, kv_demand_tokens
from model.hardware.silicon import Silicon, silicon_for
from model.physics.features import Case
from model.physics.memory import MemoryChoice
from model.physics.shape import ModelShape
from model.physics.terms import DECODE_TERMS, Physics, physics_for
from model.predict.capabilities import exclusions as capability_exclusions
from model.predict.predictor import predictor_for
from model.schemas import ConfigPrediction, Exclusion, construct
from model.workload import Config, Workload

BARE_REL_SIGMA = 0.05     # added relative sd when only KV bytes are known (no weights, FLOPs)
# evaluate() unpacks a prediction table's row as its PARTS leading columns by name, then the
# decode terms
assert PARTS == 9 and N_TABLE == PARTS + len(DECODE_TERMS)


class Evaluated(NamedTuple):
    """One configuration's prediction (the seconds of each term of its decode step in
    ``pred.step_terms_s``) and whether it may be recommended."""

    config: Config
    pred: ConfigPrediction
    eligible: bool


# ------------------------------------------------------------------------ configurations
def candidates(w: Workload, shape: ModelShape) -> tuple[list[Config], list[Exclusion]]:
    """The configurations to evaluate and the ones excluded, with why."""
    blocked = capability_exclusions(w.requirements, shape) if w.requirements else {}
    ok, excluded = _candidates(tuple(w.engines or engines.names()), tuple(dcp_sizes(w)),
                               w.num_gpus, shape.attention, shape.kv_heads,
                               tuple(sorted(blocked.items())))
    return list(ok), list(excluded)


@lru_cache(maxsize=1024)
def _candidates(names: tuple[str, ...], dcps: tuple[int, ...], tp: int, attention: str,
                kv_heads: int, blocked: tuple[tuple[str, str], ...]
                ) -> tuple[tuple[Config, ...], tuple[Exclusion, ...]]:
    why = dict(blocked)
    ok, excluded = [], []
    for engine in names:
        if engine in why:
            excluded.append(Exclusion(engine=engine, reason=why[engine]))
            continue
        rules = engines.get(engine)
        for dcp in dcps:
            reason = rules.dcp_constraint(dcp, tp, attention, kv_heads)
            if reason:
                excluded.append(Exclusion(engine=engine, dcp_size=dcp, reason=reason))
            else:
                ok.append(Config(engine, dcp))
    return tuple(ok), tuple(excluded)


def dcp_sizes(w: Workload) -> list[int]:
    """The DCP sizes to consider: the workload's, else every divisor of its TP size."""
    return sorted(set(w.dcp_sizes)) if w.dcp_sizes else list(divisors(w.num_gpus))


@lru_cache(maxsize=64)
def divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def excluded_field(w: Workload, excluded: list[Exclusion]) -> str:
    """The workload field that excluded every configuration."""
    if w.dcp_sizes and all(x.dcp_size for x in excluded):
        return "dcp_sizes"
    return "requirements" if w.requirements else "engines"


# ------------------------------------------------------------------------ calibration coverage
def doublings_outside(rng: dict[str, list[float]] | None, values: dict[str, float]) -> float:
    """How many doublings ``values`` lie outside a calibrated range (0 inside, and 0 without a
    range: a transferred configuration is widened by its own term)."""
    if rng is None:
        return 0.0
    out = 0.0
    for d, v in values.items():
        lo, hi = rng[d]
        if v > hi:
            out += math.log2(v / hi)
        elif v < lo:
            out += math.log2(lo / v)
    return out


def coverage(model: CostModel, engine: str, gpu: str, num_gpus: int, dcp: int, model_key: str,
             values: dict[str, float]) -> tuple[str, float]:
    """("calibrated" | "transferred" | "uncalibrated", doublings outside the calibrated range
    of ``model.fit.costmodel.RANGE_DIMS``; infinite when uncalibrated)."""
    status, rng = model.calibrated_range(engine, gpu, num_gpus, dcp, model_key)
    if status == "uncalibrated":
        return status, math.inf
    return status, doublings_outside(rng, values)


def memory_choice(model: CostModel, engine: str, gpu: str) -> MemoryChoice:
    """The memory fraction for ``engine`` on ``gpu`` (memoised in the model's predictor)."""
    return predictor_for(model).memory(engine, gpu)


# ------------------------------------------------------------------------ rows and predictions
def build_case(model: CostModel, w: Workload, shape: ModelShape, configs: list[Config],
               contexts: np.ndarray | None = None, si: Silicon | None = None,
               ph: Physics | None = None) -> Case:
    """The one place a query is built: one row per config at the workload's context, or per
    (config, context) config-major when ``contexts`` is given. ``si``, ``ph``: the workload's
    GPU's ``silicon_for`` and ``physics_for`` when the caller has them."""
    si = si or silicon_for(w.gpu_spec())
    facts = predictor_for(model).facts(si.gpu.name, w.num_gpus, shape.key, shape.attention,
                                       tuple(configs))
    share_in = w.requirements.prefix_reuse_share if w.requirements else 0.0
    if contexts is None:
        ctx = float(w.context_tokens)
        share = ([effective_share(e, share_in, ctx) for e in facts.engines] if share_in > 0
                 else 0.0)
        return Case(shape, si, w.num_gpus, facts.engines, float(w.batch_size), ctx,
                    float(w.output_tokens), facts.dcps, facts.fractions, share, facts,
                    ph or physics_for(shape, si, w.num_gpus))
    grid = np.asarray(contexts, dtype=float)
    k = len(grid)
    engine = np.repeat(np.array(facts.engines), k)
    share = (np.array([effective_share(e, share_in, x) for e in facts.engines for x in grid])
             if share_in > 0 else 0.0)
    n = len(engine)
    return Case(shape, si, w.num_gpus, engine, np.full(n, float(w.batch_size)),
                np.tile(grid, len(configs)), np.full(n, float(w.output_tokens)),
                np.repeat(np.array(facts.dcps), k), np.repeat(np.array(facts.fractions), k),
                share, facts, ph)


def evaluate(model: CostModel, w: Workload, shape: ModelShape, configs: list[Config],
             si: Silicon | None = None, ph: Physics | None = None) -> list[Evaluated]:
    """Every config's prediction, memory and calibration status at the workload's context."""
    if not configs:
        return []
    case = build_case(model, w, shape, configs, si=si, ph=ph)
    per_config = case.facts.per_config
    sizes = {"context_tokens": w.context_tokens, "batch_size": w.batch_size,
             "output_tokens": w.output_tokens}
    bare_sigma = 0.0 if shape.weights_known else BARE_REL_SIGMA
    # doublings outside the calibrated range (calibrated configurations only) and the
    # relative sd they and the calibration status add
    dists = [doublings_outside(p[5], sizes) if p[5] is not None else 0.0 for p in per_config]
    extra = np.array([p[6] + EXTRAPOLATION_REL_SIGMA * d + bare_sigma
                      for p, d in zip(per_config, dists, strict=True)])
    rows = predictor_for(model).table(case, extra).tolist()
    demand = float(kv_demand_tokens(w.batch_size, w.context_tokens, w.output_tokens,
                                    w.requirements.prefix_reuse_share if w.requirements else 0))
    source = case.physics.read_source
    # the physics prior answers when no configuration holding a sequence has calibration
    # data for this hardware; allow_extrapolation matters only when one has
    anyway = w.allow_extrapolation or not any(
        (p[2] or p[3]) and t[FEASIBLE] > 0.0 for p, t in zip(per_config, rows, strict=True))
    out = []
    for c, (engine, dcp, calibrated, transferred, fraction, _, _), dist, t in zip(
            configs, per_config, dists, rows, strict=True):
        # the table's columns (model.formulas: TOTAL ... FEASIBLE, then the decode terms in
        # DECODE_TERMS' order, checked below the imports)
        total, lo, hi, _, pf, tpot, run, cap, ok = t[:PARTS]
        out.append(_evaluated((c, construct(ConfigPrediction, {
            "engine": engine, "dcp_size": dcp, "total_s": total,
            "prefill_s": pf, "decode_s": total - pf if total > pf else 0.0, "tpot_s": tpot,
            "interval_s": (lo, hi), "calibrated": calibrated,
            "extrapolated": not calibrated or dist > 0,
            "transferred": transferred, "mem_fraction": fraction,
            "kv_capacity_tokens": int(cap) if cap < 2 ** 62 else 2 ** 62,
            "fits_in_memory": demand <= cap, "running_sequences": int(run) if ok else 0,
            "kv_read_source": source,
            "step_terms_s": dict(zip(DECODE_TERMS, t[PARTS:], strict=False))}),
            (anyway or calibrated or transferred) and ok > 0.0)))
    return out


_evaluated = partial(tuple.__new__, Evaluated)    # Evaluated((...)) without its Python __new__


def total_curves(model: CostModel, w: Workload, shape: ModelShape, configs: list[Config],
                 contexts: np.ndarray, si: Silicon | None = None) -> np.ndarray:
    """Predicted total seconds, shape (len(configs), len(contexts)); NaN where not even one
    sequence fits."""
    p = predictor_for(model).predict(build_case(model, w, shape, configs, contexts, si))
    total = np.where(p.feasible, p.total, np.nan)
    return total.reshape(len(configs), len(contexts))
