"""A workload as a query: the configurations it allows, their rows, and every configuration's
prediction at the workload's sizes (``Query``, gathered by
``engine_advisor.model.queries.query_for``).

``candidates`` applies the engines' DCP rules and the workload's requirements
(``engine_advisor.model.predict.capabilities``); ``build_case`` is the one place a query's rows are
built; ``evaluate`` predicts them (``engine_advisor.model.predict.predictor``) with intervals
widened by how far the workload lies from calibration data (``coverage``) and says which may be
recommended.
"""

from __future__ import annotations

import math
from functools import lru_cache, partial
from typing import NamedTuple

import numpy as np

from engine_advisor.model import engines
from engine_advisor.model.engines import effective_share
from engine_advisor.model.engines.base import knobs_of
from engine_advisor.model.fit.costmodel import (
    EXTRAPOLATION_REL_SIGMA,
    RANGE_DIMS,
    CostModel,
)
from engine_advisor.model.formulas.evaluate import E_FEASIBLE, E_PARTS, N_EVAL, evaluate_rows
from engine_advisor.model.hardware.gpus import gpu_family
from engine_advisor.model.hardware.silicon import Silicon, silicon_for
from engine_advisor.model.physics.features import Case
from engine_advisor.model.physics.memory import MemoryChoice
from engine_advisor.model.physics.moe import moe_kernel
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.physics.terms import DECODE_TERMS, Physics, physics_for
from engine_advisor.model.predict.capabilities import exclusions as capability_exclusions
from engine_advisor.model.predict.predictor import Z90, predictor_for
from engine_advisor.model.schemas import ConfigPrediction, Exclusion, constructor
from engine_advisor.model.workload import Config, Workload

BARE_REL_SIGMA = 0.05     # added relative sd when only KV bytes are known (no weights, FLOPs)
# Query.evaluate unpacks an evaluation's row by name: its E_PARTS leading columns, then the
# decode terms, written as a literal in DECODE_TERMS' order (tests/model/test_batch.py)
assert E_PARTS == 18 and N_EVAL == E_PARTS + len(DECODE_TERMS)


class Evaluated(NamedTuple):
    """One configuration's prediction (the seconds of each term of its decode step in
    ``pred.step_terms_s``), whether it may be recommended (as ``pred.eligible``, and
    ``pred.ineligible_reason`` says why not), and with the engine's default
    memory knobs (where the prediction sets others: ``pred.memory_flags``) the sequences at
    once, the KV capacity and what binds them."""

    config: Config
    pred: ConfigPrediction
    eligible: bool
    defaults: tuple[int, int, str] | None = None


# ------------------------------------------------------------------------ configurations
def candidates(w: Workload, shape: ModelShape) -> tuple[list[Config], list[Exclusion]]:
    """The configurations to evaluate and the ones excluded, with why."""
    blocked = capability_exclusions(w.requirements, shape) if w.requirements else {}
    ok, excluded = _candidates(tuple(w.engines or engines.defaults()), tuple(dcp_sizes(w)),
                               w.num_gpus, shape.attention, shape.kv_heads,
                               tuple(sorted(blocked.items())), gpu_family(w.gpu_spec().name))
    return list(ok), list(excluded)


@lru_cache(maxsize=1024)
def _candidates(names: tuple[str, ...], dcps: tuple[int, ...], tp: int, attention: str,
                kv_heads: int, blocked: tuple[tuple[str, str], ...], family: str = ""
                ) -> tuple[tuple[Config, ...], tuple[Exclusion, ...]]:
    why = dict(blocked)
    ok, excluded = [], []
    for engine in names:
        if engine in why:
            excluded.append(Exclusion(engine=engine, reason=why[engine]))
            continue
        rules = engines.get(engine)
        for dcp in dcps:
            reason = rules.dcp_constraint(dcp, tp, attention, kv_heads, family)
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
    of ``engine_advisor.model.fit.costmodel.RANGE_DIMS``; infinite when uncalibrated)."""
    status, rng = model.calibrated_range(engine, gpu, num_gpus, dcp, model_key)
    if status == "uncalibrated":
        return status, math.inf
    return status, doublings_outside(rng, values)


def memory_choice(model: CostModel, engine: str, gpu: str) -> MemoryChoice:
    """The memory fraction for ``engine`` on ``gpu`` (memoised in the model's predictor)."""
    return predictor_for(model).memory(engine, gpu)


# ------------------------------------------------------------------------ rows and predictions
def build_case(model: CostModel, w: Workload, shape: ModelShape, configs: list[Config],
               contexts: np.ndarray | None = None, si: Silicon | None = None) -> Case:
    """A workload's rows for the batch path (``Predictor.predict``): per (config, context),
    config-major, over ``contexts`` (the workload's own when None). ``si``: the workload's
    GPU's ``silicon_for`` when the caller has it. A recommendation's one row per
    configuration is ``Query.evaluate``'s."""
    si = si or silicon_for(w.gpu_spec())
    facts = predictor_for(model).facts(si.gpu, w.num_gpus, shape, tuple(configs))
    share_in = w.requirements.prefix_reuse_share if w.requirements else 0.0
    grid = np.asarray([w.context_tokens] if contexts is None else contexts, dtype=float)
    k = len(grid)
    engine = np.repeat(np.array(facts.engines), k)
    share = (np.array([effective_share(e, share_in, x) for e in facts.engines for x in grid])
             if share_in > 0 else 0.0)
    n = len(engine)
    return Case(shape, si, w.num_gpus, engine, np.full(n, float(w.batch_size)),
                np.tile(grid, len(configs)), np.full(n, float(w.output_tokens)),
                np.repeat(np.array(facts.dcps), k), np.repeat(np.array(facts.fractions), k),
                share, physics_for(shape, si, w.num_gpus), advise=True)


class Query:
    """A workload without its sizes (context, output, batch): everything its predictions need that
    the sizes do not change, gathered once (``engine_advisor.model.queries.query_for``): the GPU's
    silicon, the served model's shape and physics, the configurations and exclusions, each
    configuration's facts (engine, DCP size, memory fraction, calibration status and range), its
    engine's stacked efficiencies and the memory choice of each engine. ``evaluate`` is then one
    compiled call and one prediction object per configuration."""

    def __init__(self, model: CostModel, w: Workload, si: Silicon, shape: ModelShape,
                 ph: Physics, configs: tuple[Config, ...] | None = None):
        """``si``, ``shape``, ``ph``: ``w``'s silicon, model shape and physics
        (``engine_advisor.model.queries.query_for`` gathers them); ``configs``: every one ``w``
        allows when None; given, they are evaluated as they are, none excluded."""
        self.pred = pred = predictor_for(model)
        self.si, self.shape, self.physics = si, shape, ph
        self.gpu = si.gpu.name
        if configs is None:
            configs, excluded = candidates(w, shape)
        else:
            excluded = []
        self.configs: tuple[Config, ...] = tuple(configs)
        self.excluded: tuple[Exclusion, ...] = tuple(excluded)
        self.memory = {e: pred.memory(e, self.gpu) for e in dict.fromkeys(c.engine
                                                                           for c in configs)}
        # per engine, where the physics of its predictions came from (a recommendation's
        # reason): the GPU's measured profiles, its own kernel tables first where it has some
        self.provenance = {e: si.for_engine(e).provenance for e in self.memory}
        # why an engine that cannot be calibrated here is not, while the model holds no data
        # of it on any GPU (Engine.uncalibrated_note: TensorRT-LLM's priors)
        self.notes = uncalibrated_notes(model, tuple(self.memory))
        # per engine, why its fused-MoE prefill kernel for this model's experts runs slower than
        # its reference ("": it does not; engine_advisor.model.physics.moe)
        self.moe_notes = {e: moe_kernel(e, shape, self.gpu, w.num_gpus).note for e in self.memory}
        self.share = w.requirements.prefix_reuse_share if w.requirements else 0.0
        self.allow_extrapolation = w.allow_extrapolation
        # why a configuration without calibration data for this hardware may not be chosen
        self.uncalibrated_why = (f"not calibrated on {self.gpu} x {w.num_gpus} "
                                 "(allow_extrapolation to consider it)")
        if not configs:
            return
        facts = pred.facts(si.gpu, w.num_gpus, shape, self.configs)
        self.facts = facts
        engines, self.index = facts.engine_index
        self.coef, self.factors, self.noise = pred.stacked(engines, si.name, shape,
                                                            w.num_gpus)
        # the compiled inputs of each silicon the configurations' engines run their kernels on
        # (Silicon.for_engine): (configuration indices or None for all, K, collectives, read
        # curves, the KV read's source); one part unless an engine has kernel tables of its own
        self.parts = kernel_parts(si, ph, shape, w.num_gpus, self.configs, facts.max_dcp)
        # added relative sd of each configuration by its calibration status and the shape's
        # knowledge; calibrated configurations add EXTRAPOLATION_REL_SIGMA per doubling
        # outside their calibrated range
        bare_sigma = 0.0 if shape.weights_known else BARE_REL_SIGMA
        self.sigma = np.array([p[6] + bare_sigma for p in facts.per_config])
        # each configuration's calibrated range (low, high) of RANGE_DIMS; none: (0, inf)
        self.bounds = np.array([[x for dim in RANGE_DIMS for x in p[5][dim]]
                                if p[5] is not None else [0.0, math.inf] * len(RANGE_DIMS)
                                for p in facts.per_config], dtype=float)
        self.no_share = np.zeros(len(configs))
        # what each prediction reports that the sizes do not change
        self.fixed = [(c, engine, dcp, calibrated, transferred, fraction)
                      for c, (engine, dcp, calibrated, transferred, fraction, _, _)
                      in zip(self.configs, facts.per_config, strict=True)]

    def evaluate(self, w: Workload) -> list[Evaluated]:
        """Every configuration's prediction, memory and calibration status at ``w``'s sizes
        (``w``: a workload of this query: its ``query_key`` is the one it was gathered for)."""
        if not self.configs:
            return []
        ctx = w.context_tokens
        share = (np.array([effective_share(e, self.share, ctx) for e in self.facts.engines])
                 if self.share > 0 else self.no_share)
        sizes = (float(w.batch_size), float(ctx), float(w.output_tokens))
        if len(self.parts) == 1:
            _, K, coll, curve, source = self.parts[0]
            table = evaluate_rows(K, coll, curve, self.facts.rows, *sizes, share, self.coef,
                                  self.factors, self.noise, self.index, self.sigma,
                                  self.bounds, EXTRAPOLATION_REL_SIGMA, Z90).tolist()
            sources = [source] * len(table)
        else:
            rows = np.empty((len(self.configs), N_EVAL))
            sources = [""] * len(self.configs)
            for idx, K, coll, curve, src in self.parts:
                rows[idx] = evaluate_rows(
                    K, coll, curve, np.ascontiguousarray(self.facts.rows[:, idx]), *sizes,
                    np.ascontiguousarray(np.broadcast_to(share, (len(self.configs),))[idx]),
                    self.coef, self.factors, self.noise, self.index[idx], self.sigma[idx],
                    np.ascontiguousarray(self.bounds[idx]), EXTRAPOLATION_REL_SIGMA, Z90)
                for i in idx:
                    sources[i] = src
            table = rows.tolist()
        # the physics prior answers when no configuration holding a sequence has calibration
        # data for this hardware; allow_extrapolation matters only when one has
        anyway = self.allow_extrapolation or not any(
            (f[3] or f[4]) and t[E_FEASIBLE] for f, t in zip(self.fixed, table, strict=True))
        # the one reason for every configuration without calibration data; None: none is held
        uncalibrated = None if anyway else self.uncalibrated_why
        seq = ctx + w.output_tokens
        notes = self.notes
        out = []
        for (c, engine, dcp, calibrated, transferred, fraction), t, source in zip(
                self.fixed, table, sources, strict=True):
            # the table's columns (engine_advisor.model.formulas.evaluate.evaluate_rows:
            # E_TOTAL ... E_DOUBLINGS, then the decode terms in DECODE_TERMS' order;
            # tests/model/test_batch.py checks both)
            (total, lo, hi, pf, decode, tpot, run, cap, fits, ok, dist, binds, knob, knob_run,
             slots, run0, cap0, binds0, gemm, moe, kv, mla, dcp_read, state, tp_comm, dcp_comm,
             dcp_fixed, kernels, moe_fixed, seq_fixed, step) = t
            # may the decision choose it (decide() chooses among these), and if not, why
            if ok <= 0.0:
                eligible, why = False, holds_nothing(seq, engine, fraction, int(cap))
            elif uncalibrated and not (calibrated or transferred):
                eligible, why = False, uncalibrated
            else:
                eligible, why = True, None
            out.append(_evaluated((c, make_prediction({
                "engine": engine, "dcp_size": dcp, "total_s": total, "prefill_s": pf,
                "decode_s": decode, "tpot_s": tpot, "interval_s": (lo, hi),
                "calibrated": calibrated, "extrapolated": not calibrated or dist > 0.0,
                "transferred": transferred, "mem_fraction": fraction,
                "kv_capacity_tokens": int(cap), "fits_in_memory": fits > 0.0,
                "running_sequences": int(run), "running_limit": LIMITS[int(binds)],
                "state_slots": int(slots) if slots else None,
                "memory_flags": memory_flags(engine, int(knob), int(knob_run), int(slots))
                if knob else [], "kv_read_source": source,
                "step_terms_s": {   # a literal: twice as fast as dict(zip(DECODE_TERMS, ...))
                    "gemm": gemm, "moe": moe, "kv_read": kv, "mla_read": mla,
                    "dcp_read": dcp_read, "state": state, "tp_comm": tp_comm,
                    "dcp_comm": dcp_comm, "dcp_fixed": dcp_fixed, "kernel_fixed": kernels,
                    "moe_fixed": moe_fixed, "seq_fixed": seq_fixed, "step_fixed": step},
                "eligible": eligible, "ineligible_reason": why,
                "calibration_note": None if calibrated else notes[engine]}),
                eligible, (int(run0), int(cap0), LIMITS[int(binds0)]) if knob else None)))
        return out


def kernel_parts(si: Silicon, ph: Physics, shape: ModelShape, tp: int,
                 configs: tuple[Config, ...], max_dcp: int) -> list[tuple]:
    """A query's compiled inputs per silicon its configurations' engines run their kernels on
    (``Silicon.for_engine``), in the order of their first configuration: (configuration
    indices, None for all; K; collectives; read curves; the KV read's source). ``ph`` is the
    physics on ``si``, the silicon of every engine without kernel tables of its own."""
    by: dict[int, tuple[Silicon, list[int]]] = {}
    for i, c in enumerate(configs):
        own = si.for_engine(c.engine)
        by.setdefault(id(own), (own, []))[1].append(i)
    parts = []
    for own, idx in by.values():
        p = ph if own is si else physics_for(shape, own, tp)
        parts.append((None if len(by) == 1 else np.array(idx, dtype=np.intp), p.K,
                      p.collectives(max_dcp), p.curve, p.read_source))
    return parts


def uncalibrated_notes(model: CostModel, names: tuple[str, ...]) -> dict[str, str | None]:
    """Per engine, why its predictions are uncalibrated where it cannot be calibrated here
    (``Engine.uncalibrated_note``) and ``model`` holds no data of it on any GPU; else None."""
    fitted = set(model.engine_names)
    return {e: None if e in fitted else engines.get(e).uncalibrated_note or None for e in names}


def holds_nothing(seq: int, engine: str, fraction: float, capacity: int) -> str:
    """Why a configuration of ``engine`` at memory fraction ``fraction`` with KV capacity
    ``capacity`` holds no sequence of ``seq`` tokens (its ``ineligible_reason``, and the
    decision's exclusion)."""
    if capacity <= 0:
        return (f"its weights leave no KV memory at {engines.get(engine).mem_flag} "
                f"{fraction:.2f} (one sequence of {seq:,} tokens does not fit)")
    return (f"not even one sequence of {seq:,} tokens fits its KV capacity of "
            f"{capacity:,} tokens")


_evaluated = partial(tuple.__new__, Evaluated)    # Evaluated((...)) without its Python __new__
# ConfigPrediction.running_limit by engine_advisor.model.formulas.memory.LIMIT_* (what
# memory_fit says binds)
LIMITS = ("none", "kv", "state", "max_running")


@lru_cache(maxsize=1024)
def _flags(engine: str, knob: int, running: int, slots: int) -> tuple[str, ...]:
    return tuple(engines.get(engine).knob_args(knobs_of(knob, running, slots)))


def memory_flags(engine: str, knob: int, running: int, slots: int) -> list[str]:
    """The engine flags of the knobs ``memory_fit`` proposed (a new list each time: the
    prediction owns it)."""
    return list(_flags(engine, knob, running, slots))
make_prediction = constructor(ConfigPrediction)


def total_curves(model: CostModel, w: Workload, shape: ModelShape, configs: list[Config],
                 contexts: np.ndarray, si: Silicon | None = None) -> np.ndarray:
    """Predicted total seconds, shape (len(configs), len(contexts)); NaN where not even one
    sequence fits."""
    p = predictor_for(model).predict(build_case(model, w, shape, configs, contexts, si))
    total = np.where(p.feasible, p.total, np.nan)
    return total.reshape(len(configs), len(contexts))
