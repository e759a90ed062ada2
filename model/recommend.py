"""The recommender: every feasible (engine, dcp) ranked by predicted total time."""

from __future__ import annotations

import math
from functools import lru_cache, partial
from operator import attrgetter, itemgetter
from typing import NamedTuple

import numpy as np

from model import engines, nofit
from model.capabilities import effective_share
from model.capabilities import exclusions as capability_exclusions
from model.costmodel import (
    EXTRAPOLATION_REL_SIGMA,
    TRANSFERRED_REL_SIGMA,
    UNCALIBRATED_REL_SIGMA,
    Case,
    CostModel,
    doublings_outside,
)
from model.formulas import DEFAULT_MAX_RUNNING, FEASIBLE, N_TABLE, PARTS
from model.memory import MemoryChoice, kv_demand_tokens
from model.predictor import CROSSOVER_CACHE_SIZE, Predictor, predictor_for
from model.schemas import ConfigPrediction, Exclusion, Recommendation, construct
from model.shape import ModelShape
from model.silicon import Silicon, silicon_for
from model.terms import DECODE_TERMS, physics_for
from model.workload import Config, Workload

CROSSOVER_RANGE = (1024, 4 * 1024 * 1024)
CROSSOVER_GRID = np.geomspace(*CROSSOVER_RANGE, 64)
BARE_REL_SIGMA = 0.05     # added relative sd when only KV bytes are known (no weights, FLOPs)
# evaluate() unpacks a prediction table's row as its PARTS leading columns by name, then the
# decode terms
assert PARTS == 9 and N_TABLE == PARTS + len(DECODE_TERMS)


class NoEligibleConfiguration(ValueError):
    """No configuration may be recommended (none calibrated, or all excluded)."""

    field = "allow_extrapolation"


class Evaluated(NamedTuple):
    """One configuration's prediction (the seconds of each term of its decode step in
    ``pred.step_terms_s``) and whether it may be recommended."""

    config: Config
    pred: ConfigPrediction
    eligible: bool


def candidates(model: CostModel, w: Workload,
               shape: ModelShape) -> tuple[list[Config], list[Exclusion]]:
    """The configurations to evaluate and the ones excluded, with why."""
    blocked = capability_exclusions(w.requirements, shape) if w.requirements else {}
    ok, excluded = _candidates(tuple(w.engines or engines.names()), tuple(dcp_sizes(w)), w.num_gpus,
                               shape.attention, shape.kv_heads, tuple(sorted(blocked.items())))
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
    return sorted(set(w.dcp_sizes)) if w.dcp_sizes else list(_divisors(w.num_gpus))


@lru_cache(maxsize=64)
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def memory_choice(model: CostModel, engine: str, gpu: str) -> MemoryChoice:
    """The memory fraction for ``engine`` on ``gpu`` (memoised in the model's predictor)."""
    return predictor_for(model).memory(engine, gpu)


def build_case(model: CostModel, w: Workload, shape: ModelShape, configs: list[Config],
               contexts: np.ndarray | None = None, si: Silicon | None = None) -> Case:
    """The one place a query is built: one row per config at the workload's context, or per
    (config, context) config-major when ``contexts`` is given. ``si``: the workload's GPU's
    ``silicon_for`` when the caller has it."""
    si = si or silicon_for(w.gpu_spec())
    facts = predictor_for(model).facts(si.gpu.name, w.num_gpus, shape.key, tuple(configs))
    share_in = w.requirements.prefix_reuse_share if w.requirements else 0.0
    if contexts is None:
        ctx = float(w.context_tokens)
        share = ([effective_share(e, share_in, ctx) for e in facts.engines] if share_in > 0
                 else 0.0)
        return Case(shape, si, w.num_gpus, facts.engines, float(w.batch_size), ctx,
                    float(w.output_tokens), facts.dcps, facts.fractions, share, facts)
    grid = np.asarray(contexts, dtype=float)
    k = len(grid)
    engine = np.repeat(np.array(facts.engines), k)
    share = (np.array([effective_share(e, share_in, x) for e in facts.engines for x in grid])
             if share_in > 0 else 0.0)
    n = len(engine)
    return Case(shape, si, w.num_gpus, engine, np.full(n, float(w.batch_size)),
                np.tile(grid, len(configs)), np.full(n, float(w.output_tokens)),
                np.repeat(np.array(facts.dcps), k), np.repeat(np.array(facts.fractions), k),
                share, facts)


def evaluate(model: CostModel, w: Workload, shape: ModelShape, configs: list[Config],
             si: Silicon | None = None) -> list[Evaluated]:
    """Every config's prediction, memory and calibration status at the workload's context."""
    if not configs:
        return []
    case = build_case(model, w, shape, configs, si=si)
    facts = case.facts
    values = {"context_tokens": w.context_tokens, "batch_size": w.batch_size,
              "output_tokens": w.output_tokens}
    bare_sigma = 0.0 if shape.weights_known else BARE_REL_SIGMA
    dists = [doublings_outside(rng, values) if status == "calibrated" else 0.0
             for status, rng in facts.ranges]
    extra = np.array([(EXTRAPOLATION_REL_SIGMA * d if status == "calibrated"
                       else _EXTRA_SIGMA[status]) + bare_sigma
                      for (status, _), d in zip(facts.ranges, dists, strict=True)])
    table = predictor_for(model).table(case, extra)
    demand = float(kv_demand_tokens(w.batch_size, w.context_tokens, w.output_tokens,
                                    w.requirements.prefix_reuse_share if w.requirements else 0))
    source = case.silicon.read_source(physics_for(shape, case.silicon, case.tp).family,
                                      shape.kv_dtype)
    # the physics prior answers when no configuration holding a sequence has calibration
    # data for this hardware; allow_extrapolation matters only when one has
    anyway = w.allow_extrapolation or not measured_fits(facts.ranges, table[:, FEASIBLE])
    out = []
    for c, (status, _), dist, fraction, t in zip(configs, facts.ranges, dists, facts.fractions,
                                                 table.tolist(), strict=True):
        # the table's columns (model.formulas: TOTAL ... FEASIBLE, then the decode terms in
        # DECODE_TERMS' order, checked below the function)
        total, lo, hi, _, pf, tpot, run, cap, ok = t[:PARTS]
        calibrated = status == "calibrated"
        out.append(_evaluated((c, construct(ConfigPrediction, {
            "engine": c.engine, "dcp_size": c.dcp_size, "total_s": total,
            "prefill_s": pf, "decode_s": total - pf if total > pf else 0.0, "tpot_s": tpot,
            "interval_s": (lo, hi), "calibrated": calibrated,
            "extrapolated": not calibrated or dist > 0,
            "transferred": status == "transferred", "mem_fraction": fraction,
            "kv_capacity_tokens": int(cap) if cap < 2 ** 62 else 2 ** 62,
            "fits_in_memory": demand <= cap, "running_sequences": int(run) if ok else 0,
            "kv_read_source": source,
            "step_terms_s": dict(zip(DECODE_TERMS, t[PARTS:], strict=True))}),
            (anyway or status != "uncalibrated") and ok > 0.0)))
    return out


def measured_fits(ranges: list[tuple[str, dict | None]], feasible) -> bool:
    """Whether a configuration that holds one sequence (``feasible`` > 0) has calibration data
    for the hardware (calibrated or transferred)."""
    return any(status != "uncalibrated" and ok > 0.0
               for (status, _), ok in zip(ranges, feasible, strict=True))


_evaluated = partial(tuple.__new__, Evaluated)    # Evaluated((...)) without its Python __new__


# Added relative sd of a prediction without calibration data for its model or hardware (a
# calibrated one adds EXTRAPOLATION_REL_SIGMA per doubling outside the calibrated range)
_EXTRA_SIGMA = {"transferred": TRANSFERRED_REL_SIGMA, "uncalibrated": UNCALIBRATED_REL_SIGMA}


def total_curves(model: CostModel, w: Workload, shape: ModelShape, configs: list[Config],
                 contexts: np.ndarray, si: Silicon | None = None) -> np.ndarray:
    """Predicted total seconds, shape (len(configs), len(contexts)); NaN where not even one
    sequence fits."""
    p = predictor_for(model).predict(build_case(model, w, shape, configs, contexts, si))
    total = np.where(p.feasible, p.total, np.nan)
    return total.reshape(len(configs), len(contexts))


def crossovers(contexts: np.ndarray, totals: np.ndarray) -> list[tuple[int, int, int]]:
    """Where the argmin of ``totals`` changes: (context, config index before, after)."""
    safe = np.where(np.isfinite(totals), totals, np.inf)
    usable = np.isfinite(safe).any(axis=0)
    best = np.argmin(safe, axis=0)
    flips = [i for i in np.nonzero(best[1:] != best[:-1])[0] if usable[i] and usable[i + 1]]
    found = []
    for i in flips:
        a, b = best[i], best[i + 1]
        d0 = safe[a, i] - safe[b, i]
        d1 = safe[a, i + 1] - safe[b, i + 1]
        lo, hi = math.log(contexts[i]), math.log(contexts[i + 1])
        if np.isfinite(d0) and np.isfinite(d1) and d0 != d1:
            t = d0 / (d0 - d1)
        else:  # one side runs out of memory between the two grid points
            t = 0.5
        found.append((int(round(math.exp(lo + t * (hi - lo)))), int(a), int(b)))
    return found


def crossover_near(model: CostModel, w: Workload, shape: ModelShape, configs: list[Config],
                   si: Silicon | None = None) -> int | None:
    """The context nearest the workload's where the best of ``configs`` (ranked, the
    workload's best first) changes, or None.

    The scan over CROSSOVER_GRID does not depend on the workload's context: it is cached per
    (workload without its context, configs) in the model's predictor."""
    if len(configs) < 2:
        return None
    pred: Predictor = predictor_for(model)
    cache = pred.crossovers
    req = w.requirements
    # the workload's best first (equal totals elsewhere keep it best), then a fixed order
    configs = [configs[0], *sorted(configs[1:])]
    si = si or silicon_for(w.gpu_spec())
    key = (shape.key, shape.kv_dtype, shape.weight_bytes, si, w.num_gpus, w.output_tokens,
           w.batch_size, req.prefix_reuse_share if req else 0.0, tuple(configs))
    found = cache.get(key)
    if found is None:
        if len(cache) >= CROSSOVER_CACHE_SIZE:
            cache.clear()
        found = cache[key] = crossovers(CROSSOVER_GRID, total_curves(
            model, w, shape, configs, CROSSOVER_GRID, si))
    if len(found) < 2:
        return found[0][0] if found else None
    return min(found, key=lambda f: abs(math.log(f[0] / w.context_tokens)))[0]


def launch_command(engine: str, dcp: int, fraction: float, w: Workload) -> list[str]:
    """``engine``'s command line for the workload's model on its GPUs
    (``model.engines.base.Engine.launch_command``), launched for the whole batch when it
    exceeds the engines' default of DEFAULT_MAX_RUNNING running sequences."""
    big = w.batch_size if w.batch_size > DEFAULT_MAX_RUNNING else None
    return engines.get(engine).launch_command(w.model or "MODEL", w.num_gpus, dcp, fraction,
                                              big, w.kv_cache_dtype)


def _overlap(a: ConfigPrediction, b: ConfigPrediction) -> bool:
    return a.interval_s[0] <= b.interval_s[1] and b.interval_s[0] <= a.interval_s[1]


def recommend(model: CostModel, w: Workload, version: str) -> Recommendation:
    shape = w.model_shape()
    configs, excluded = candidates(model, w, shape)
    if not configs:
        exc = NoEligibleConfiguration("every configuration is excluded: "
                                      + "; ".join(x.describe() for x in excluded))
        exc.field = excluded_field(w, excluded)
        raise exc
    si = silicon_for(w.gpu_spec())
    evals = evaluate(model, w, shape, configs, si)
    for e in evals:
        if e.pred.running_sequences == 0:
            excluded.append(Exclusion(engine=e.config.engine, dcp_size=e.config.dcp_size,
                                      reason=_holds_nothing(w, e.pred)))
    ranked = sorted(evals, key=_total)
    eligible = [e for e in ranked if e.eligible]
    if not eligible:    # evaluate() makes every configuration holding a sequence eligible
        raise does_not_fit(model, w, shape, si)
    best = eligible[0]
    bp = best.pred
    others = [e for e in eligible[1:] if e.config.engine != best.config.engine] or eligible[1:]
    rival = others[0] if others else None
    speedup = rival.pred.total_s / bp.total_s if rival else None
    prior = not any(e.pred.calibrated or e.pred.transferred for e in eligible)
    if prior:
        confidence = "prior"
    elif not (bp.calibrated or bp.transferred) or (rival and _overlap(bp, rival.pred)):
        confidence = "low"
    elif (bp.extrapolated or not bp.fits_in_memory or not shape.weights_known):
        confidence = "medium"
    else:
        confidence = "high"
    cross = crossover_near(model, w, shape, [e.config for e in eligible], si)
    # ranked before the best are configurations not measured or holding no sequence
    unmeasured = (None if ranked[0] is best else
                  next((e for e in ranked if e is not best and e.pred.running_sequences
                        and e.pred.total_s < bp.total_s), None))
    prior_why = None
    if prior:
        where = f"{si.gpu.name} x {w.num_gpus}"
        prior_why = (f"the configurations calibrated on {where} hold no sequence of this "
                     "workload" if any(e.pred.calibrated or e.pred.transferred for e in evals)
                     else f"no configuration is calibrated on {where}")
    reasons = _reasons(w, shape, si, best, rival, speedup, cross, confidence, unmeasured,
                       prior_why)
    mem = memory_choice(model, best.config.engine, si.gpu.name)
    reasons.append(mem.reason)
    return construct(Recommendation, {
        "engine": best.config.engine, "dcp_size": best.config.dcp_size,
        "mem_fraction": bp.mem_fraction,
        "mem_fraction_flag": engines.get(best.config.engine).mem_flag,
        "predictions": [e.pred for e in ranked],
        "speedup": speedup, "confidence": confidence, "crossover_context_tokens": cross,
        "kv_capacity_tokens": bp.kv_capacity_tokens, "fits_in_memory": bp.fits_in_memory,
        "launch_command": launch_command(best.config.engine, best.config.dcp_size,
                                         bp.mem_fraction, w),
        "reasons": reasons, "excluded": excluded, "model_version": version})


def excluded_field(w: Workload, excluded: list[Exclusion]) -> str:
    """The workload field that excluded every configuration."""
    if w.dcp_sizes and all(x.dcp_size for x in excluded):
        return "dcp_sizes"
    return "requirements" if w.requirements else "engines"


def _holds_nothing(w: Workload, p: ConfigPrediction) -> str:
    seq = w.context_tokens + w.output_tokens
    if p.kv_capacity_tokens <= 0:
        return (f"its weights leave no KV memory at {engines.get(p.engine).mem_flag} "
                f"{p.mem_fraction:.2f} "
                f"(one sequence of {seq:,} tokens does not fit)")
    return (f"not even one sequence of {seq:,} tokens fits its KV capacity of "
            f"{p.kv_capacity_tokens:,} tokens")


def does_not_fit(model: CostModel, w: Workload, shape: ModelShape,
                 si: Silicon) -> NoEligibleConfiguration:
    """The error when no configuration holds one sequence: the cause with its numbers and what
    would fit (``model.nofit``), blaming ``num_gpus`` (weights) or ``context_tokens`` (KV)."""
    configs, _ = candidates(model, w, shape)
    names = list(dict.fromkeys(c.engine for c in configs))
    fractions = {e: memory_choice(model, e, si.gpu.name).fraction for e in names}
    sizes = dcp_sizes(w)

    def dcps_for(engine: str, n: int) -> list[int]:
        own = [d for d in sizes if n % d == 0] if w.dcp_sizes else list(_divisors(n))
        rules = engines.get(engine)
        return [d for d in own
                if rules.dcp_constraint(d, n, shape.attention, shape.kv_heads) is None]

    why = nofit.explain(w, shape, fractions, dcps_for)
    exc = NoEligibleConfiguration(why.message)
    exc.field = why.field
    return exc


def warm_up(model: CostModel) -> None:
    """One recommendation of the seed's workload and one decode and prefill of its terms, so
    that the compiled formulas (``model.formulas``: compiled on a fresh checkout, loaded from
    numba's cache after) are ready before the first query is timed or served."""
    w = Workload(context_tokens=65_536, output_tokens=256, batch_size=8, preset="kimi-k3",
                 allow_extrapolation=True)
    try:
        recommend(model, w, "warm-up")
    except NoEligibleConfiguration:    # a model without these engines: compiled all the same
        pass
    ph = physics_for(w.model_shape(), silicon_for(w.gpu_spec()), w.num_gpus)
    ph.decode(1.0, 1.0, 1.0)             # the simulator's step timer calls these one by one
    ph.prefill(1.0, 1.0)


def _label(e: Evaluated) -> str:
    return f"{e.config.engine} dcp {e.config.dcp_size}"


def _share(x: float) -> str:
    """'37%', or 'under 1%' / 'over 99%' where rounding would say 0 % or 100 % of a part that
    is there."""
    if 0.0 < x < 0.005:
        return "under 1%"
    if 0.995 <= x < 1.0:
        return "over 99%"
    return f"{x:.0%}"


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms"


STEP_NAMES = {"gemm": "dense weights/GEMMs", "moe": "routed experts", "kv_read": "KV reads",
              "mla_read": "MLA latent reads", "dcp_read": "DCP attention reads",
              "state": "linear-attention state", "tp_comm": "TP all-reduce",
              "dcp_comm": "DCP collectives", "dcp_fixed": "DCP merge fixed",
              "layer_fixed": "per-layer fixed", "seq_fixed": "per-sequence",
              "step_fixed": "per-step fixed"}


def step_story(parts: dict[str, float]) -> str:
    """'weights 12.0 ms, KV reads 4.1 ms, ...' of one decode step, largest first."""
    items = sorted(parts.items(), key=_second, reverse=True)
    return ", ".join([f"{STEP_NAMES[k]} {v * 1e3:.1f} ms" for k, v in items if v > 0])


TIE = 0.05          # two engines predicted within 5 % of each other tie (model.validation)
_second = itemgetter(1)
_total = attrgetter("pred.total_s")


def _reasons(w: Workload, shape: ModelShape, si: Silicon, best: Evaluated,
             rival: Evaluated | None, speedup: float | None, cross: int | None,
             confidence: str, unmeasured: Evaluated | None,
             prior_why: str | None = None) -> list[str]:
    """``unmeasured``: the fastest configuration, when it is faster than ``best`` but may not
    be chosen (no calibration data, and ``allow_extrapolation`` is false). ``prior_why``: why
    the answer is the physics prior's (no calibrated configuration holds a sequence)."""
    bp = best.pred
    best_l = _label(best)
    rival_l = _label(rival) if rival else ""
    r = [f"{best_l} is predicted fastest{' of the measured configurations' if unmeasured else ''}"
         f": {bp.total_s:.1f} s for {w.batch_size} sequences "
         f"of {w.context_tokens:,} + {w.output_tokens:,} tokens"
         + (f", {speedup:.2f}x faster than {rival_l} ({rival.pred.total_s:.1f} s)"
            if rival and speedup else "")]
    if unmeasured:
        u = unmeasured.pred.total_s
        r.append(f"{_label(unmeasured)}, not measured on {si.gpu.name} x {w.num_gpus}, "
                 f"is predicted {bp.total_s / u:.2f}x faster ({u:.1f} s) by the physics prior: "
                 "calibrate it, or set allow_extrapolation to let it be chosen")
    step = sum(best.pred.step_terms_s.values()) or 1e-12
    r.append(f"decode is {_share(bp.decode_s / max(bp.total_s, 1e-12))} of the time; one decode "
             f"step of {bp.running_sequences} sequences takes {_ms(step)}: "
             f"{step_story(best.pred.step_terms_s)}")
    if rival:
        rstep = sum(rival.pred.step_terms_s.values())
        r.append(f"{rival_l}: {_ms(rstep)} per step of {rival.pred.running_sequences} "
                 f"sequences: {step_story(rival.pred.step_terms_s)}")
    if bp.running_sequences < w.batch_size:
        r.append(f"KV capacity {bp.kv_capacity_tokens:,} tokens holds {bp.running_sequences} of "
                 f"the {w.batch_size} sequences at once: the engine queues the rest and admits "
                 "each as a running one finishes, which the prediction includes")
    if rival and rival.pred.running_sequences < w.batch_size and rival.pred.running_sequences:
        r.append(f"{rival_l} holds {rival.pred.running_sequences} of {w.batch_size} "
                 f"sequences at once ({rival.pred.kv_capacity_tokens:,} KV tokens)")
    if cross:
        r.append(f"the best engine changes near {cross:,} context tokens")
    if not shape.weights_known:
        r.append("only KV bytes per token are known (no preset or config.json): weights, "
                 "FLOPs and per-layer costs are not modelled, so KV capacity is an upper bound "
                 "and the interval is widened")
    if bp.transferred:
        r.append(f"{best_l} is calibrated on {si.gpu.name} x {w.num_gpus} for other "
                 f"models: this model's physics with the engine's fitted efficiencies "
                 "(transferred; interval widened)")
    elif prior_why:
        names = best_l + (f" and {rival_l}" if rival else "")
        r.append(f"answered from the physics prior: {prior_why}, so every prediction uses the "
                 f"engines' prior efficiencies and their intervals are widened "
                 f"(+{UNCALIBRATED_REL_SIGMA:.0%} relative sd); calibrate {names} on "
                 f"{si.gpu.name} x {w.num_gpus} near "
                 f"{w.context_tokens:,} context tokens (engine-advisor calibrate run, then fit) "
                 "to replace it")
        if rival and speedup is not None and speedup < 1.005:
            r.append("the prior gives both engines the same efficiencies: only their memory "
                     "(KV capacity, reserve) tells them apart here, so the choice between them "
                     "is not informed by measurements")
    elif not bp.calibrated:
        r.append(f"{best_l} has no calibration data on {si.gpu.name} x {w.num_gpus}: "
                 "extrapolated from the physics prior (allow_extrapolation)")
    elif bp.extrapolated:
        r.append("the workload lies outside the calibrated range: the interval is widened")
    if rival and speedup is not None and rival.config.engine != best.config.engine \
            and speedup < 1.0 + TIE:
        r.append(f"{best.config.engine} and {rival.config.engine} tie: {best_l} is predicted "
                 f"only {speedup:.2f}x faster than {rival_l}, within the {TIE:.0%} the engines' "
                 "measured efficiencies can tell apart; choose on other needs")
    if confidence == "low" and rival:
        r.append(f"low confidence: the prediction intervals of {best_l} and "
                 f"{rival_l} overlap")
    r.append(si.provenance)
    return r
