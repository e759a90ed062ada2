"""The proxy's one call into the cost model: the predicted cost of each configured pool.

Routing needs each (engine, DCP size) group's prediction for a workload, not the
recommender's ranking text, launch command, memory reasons or crossover scan. Every call from
``service/proxy`` into ``model/`` goes through ``pool_costs``; it uses
``model.recommend.candidates`` (which configurations the workload allows) and
``model.recommend.evaluate`` (their predictions, one pass), nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.costmodel import CostModel
from model.recommend import candidates, evaluate
from model.workload import Workload

Group = tuple[str, int]          # (engine, DCP size)


@dataclass(frozen=True)
class PoolCost:
    total_s: float               # the workload's batch, prefill and decode
    prefill_s: float
    tpot_s: float
    interval_s: tuple[float, float]
    calibrated: bool
    transferred: bool            # calibrated hardware, another model (model.costmodel.coverage)
    extrapolated: bool
    fits_in_memory: bool
    eligible: bool               # calibrated, or extrapolation allowed by the pools file


def pool_costs(model: CostModel, workload: Workload) -> dict[Group, PoolCost]:
    """Each allowed (engine, DCP size) of ``workload.engines`` x ``workload.dcp_sizes``."""
    layout = workload.model_shape()
    configs, _ = candidates(model, workload, layout)
    out = {}
    for e in evaluate(model, workload, layout, configs):
        p = e.pred
        out[(e.config.engine, e.config.dcp_size)] = PoolCost(
            p.total_s, p.prefill_s, p.tpot_s, tuple(p.interval_s), p.calibrated,
            p.transferred, p.extrapolated, p.fits_in_memory, e.eligible)
    return out


def confidence(best: PoolCost, rival: PoolCost | None) -> str:
    """How sure the choice of ``best`` over the best other engine's ``rival`` is: low when
    uncalibrated or the prediction intervals overlap, medium when extrapolated or the batch's
    KV does not fit, else high (the recommender's rule, on the routed pools only)."""
    overlap = (rival is not None and best.interval_s[0] <= rival.interval_s[1]
               and rival.interval_s[0] <= best.interval_s[1])
    if not (best.calibrated or best.transferred) or overlap:
        return "low"
    if best.extrapolated or not best.fits_in_memory:
        return "medium"
    return "high"
