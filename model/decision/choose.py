"""The choice among a workload's evaluated configurations: the fastest that may be recommended,
its closest rival (another engine where there is one), how sure the choice is, and where the
best configuration changes with context."""

from __future__ import annotations

from operator import attrgetter
from typing import NamedTuple

from engine_advisor.model import engines
from engine_advisor.model.decision import nofit
from engine_advisor.model.decision.crossover import crossover_near
from engine_advisor.model.errors import NoEligibleConfiguration
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.hardware.gpus import gpu_family
from engine_advisor.model.hardware.silicon import Silicon
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.predict.query import (
    Evaluated,
    Query,
    candidates,
    dcp_sizes,
    divisors,
    memory_choice,
)
from engine_advisor.model.schemas import ConfigPrediction, Exclusion
from engine_advisor.model.workload import Workload

_total = attrgetter("pred.total_s")


class Decision(NamedTuple):
    """What the decision stage hands to the presentation: every evaluation ranked by total
    time, the chosen one, its rival and speed-up over it, the confidence, the crossover near
    the workload's context, the fastest configuration that may not be chosen (when it beats
    the choice), why the answer is the physics prior's (or None), and the exclusions."""

    ranked: list[Evaluated]
    best: Evaluated
    rival: Evaluated | None
    speedup: float | None
    confidence: str
    crossover: int | None
    unmeasured: Evaluated | None
    prior_why: str | None
    excluded: list[Exclusion]


def decide(q: Query, w: Workload, evals: list[Evaluated]) -> Decision:
    """Rank ``evals``, the predictions of query ``q`` at ``w``'s sizes, and choose; raises
    ``NoEligibleConfiguration`` (``does_not_fit``) when no configuration holds one sequence.
    The decision's exclusions are the query's and every configuration that holds none."""
    pred, shape, si = q.pred, q.shape, q.si
    excluded = list(q.excluded)
    for e in evals:
        if e.pred.running_sequences == 0:    # the reason evaluate() gave it
            excluded.append(Exclusion(engine=e.config.engine, dcp_size=e.config.dcp_size,
                                      reason=e.pred.ineligible_reason))
    ranked = sorted(evals, key=_total)
    eligible = [e for e in ranked if e.eligible]
    if not eligible:    # evaluate() makes every configuration holding a sequence eligible
        raise does_not_fit(pred.model, w, shape, si)
    best = eligible[0]
    bp = best.pred
    others = [e for e in eligible[1:] if e.config.engine != best.config.engine] or eligible[1:]
    rival = others[0] if others else None
    speedup = rival.pred.total_s / bp.total_s if rival else None
    confidence, prior_why = trust(bp, rival.pred if rival else None, eligible, evals,
                                  shape.weights_known, si.gpu.name, w.num_gpus)
    cross = crossover_near(q, w, [e.config for e in eligible])
    # ranked before the best are configurations not measured or holding no sequence
    unmeasured = (None if ranked[0] is best else
                  next((e for e in ranked if e is not best and e.pred.running_sequences
                        and e.pred.total_s < bp.total_s), None))
    return Decision(ranked, best, rival, speedup, confidence, cross, unmeasured, prior_why,
                    excluded)


def trust(best: ConfigPrediction, rival: ConfigPrediction | None, eligible: list[Evaluated],
          evals: list[Evaluated], weights_known: bool, gpu: str, num_gpus: int
          ) -> tuple[str, str | None]:
    """How far to trust choosing ``best`` over ``rival`` (the configuration that contests it;
    None: none does) among the ``eligible`` of the evaluations ``evals`` on ``gpu`` x
    ``num_gpus``, as (confidence, why the answer is the physics prior's or None): one rule for
    ``/v1/recommend`` (``decide``) and ``/v1/plan`` (``engine_advisor.model.plan``).

    ``prior`` when no eligible configuration is calibrated (or transferred) for the hardware
    (why: none is, or those that are hold no sequence of the workload); ``low`` when ``best``
    is neither, or ``rival``'s interval overlaps its own; ``medium`` when it is extrapolated,
    the batch's KV is over its capacity or only the model's KV bytes per token are known
    (``weights_known`` false); else ``high``."""
    if not any(e.pred.calibrated or e.pred.transferred for e in eligible):
        where = f"{gpu} x {num_gpus}"
        return "prior", (f"the configurations calibrated on {where} hold no sequence of this "
                         "workload" if any(e.pred.calibrated or e.pred.transferred for e in evals)
                         else f"no configuration is calibrated on {where}")
    if not (best.calibrated or best.transferred) or (rival is not None and overlap(best, rival)):
        return "low", None
    if best.extrapolated or not best.fits_in_memory or not weights_known:
        return "medium", None
    return "high", None


def overlap(a: ConfigPrediction, b: ConfigPrediction) -> bool:
    """Whether the 90 % intervals of ``a`` and ``b`` overlap."""
    return a.interval_s[0] <= b.interval_s[1] and b.interval_s[0] <= a.interval_s[1]


def does_not_fit(model: CostModel, w: Workload, shape: ModelShape,
                 si: Silicon) -> NoEligibleConfiguration:
    """The error when no configuration holds one sequence: the cause with its numbers and what
    would fit (``engine_advisor.model.decision.nofit``), blaming ``num_gpus`` (weights) or
    ``context_tokens`` (KV)."""
    configs, _ = candidates(w, shape)
    names = list(dict.fromkeys(c.engine for c in configs))
    fractions = {e: memory_choice(model, e, si.gpu.name).fraction for e in names}
    sizes = dcp_sizes(w)

    def dcps_for(engine: str, n: int) -> list[int]:
        own = [d for d in sizes if n % d == 0] if w.dcp_sizes else list(divisors(n))
        rules = engines.get(engine)
        family = gpu_family(si.gpu.name)
        return [d for d in own
                if rules.dcp_constraint(d, n, shape.attention, shape.kv_heads, family) is None]

    why = nofit.explain(w, shape, fractions, dcps_for)
    exc = NoEligibleConfiguration(why.message)
    exc.field = why.field
    return exc
