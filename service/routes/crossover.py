"""POST /v1/crossover: where the best engine changes as the context grows."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter

from engine_advisor.model.decision.choose import does_not_fit
from engine_advisor.model.decision.crossover import crossovers, engine_envelopes
from engine_advisor.model.predict.query import excluded_field, total_curves
from engine_advisor.model.queries import query_for
from engine_advisor.service.deps import JsonRoute, ModelDep
from engine_advisor.service.errors import ApiError, error_responses
from engine_advisor.service.schemas import (
    ConfigRef,
    Crossing,
    CrossoverRequest,
    CrossoverResponse,
    Curve,
)

router = APIRouter(prefix="/v1/crossover", tags=["crossover"], route_class=JsonRoute)

SEARCH_POINTS = 256
DEFAULT_POINTS = 16


def _crossings(grid: np.ndarray, totals: np.ndarray, refs: list[list[ConfigRef]]) -> list[Crossing]:
    """``refs[row][i]``: the configuration that row stands for at grid point i."""
    out = []
    for x, a, b in crossovers(grid, totals):
        i = int(np.clip(np.searchsorted(grid, x) - 1, 0, len(grid) - 2))
        out.append(Crossing(context_tokens=x, before=refs[a][i], after=refs[b][i + 1]))
    return out


@router.post("", response_model=CrossoverResponse, responses=error_responses(400, 413, 422, 503),
             summary="Context length where the best engine changes, with time-vs-context curves")
async def crossover(body: CrossoverRequest, loaded: ModelDep) -> CrossoverResponse:
    model = loaded.model
    lo, hi = body.context_range
    w = body.model_copy(update={"context_tokens": lo})
    q = query_for(model, w)
    layout = q.shape
    if not q.configs:
        field = excluded_field(w, q.excluded)
        raise ApiError(422, f"{field}: no configuration to compare: "
                       + "; ".join(x.describe() for x in q.excluded), param=field)
    evals = q.evaluate(w)
    ok = [e for e in evals if e.eligible]   # all that hold a sequence, when none is calibrated
    if not ok:      # not one sequence of the range's shortest context fits
        exc = does_not_fit(model, w, layout, q.si)
        field = "context_range" if exc.field == "context_tokens" else exc.field
        raise ApiError(422, f"{field}: no configuration to compare at {lo:,} context tokens: "
                       f"{exc}", param=field)
    cfgs = [e.config for e in ok]
    labels = [ConfigRef(engine=c.engine, dcp_size=c.dcp_size) for c in cfgs]
    grid = np.geomspace(lo, hi, SEARCH_POINTS)
    totals = total_curves(model, w, layout, cfgs, grid)
    config_refs = [[lab] * len(grid) for lab in labels]
    # each engine at its best DCP size, point by point
    engines, env, env_rows = engine_envelopes(totals, [c.engine for c in cfgs])
    env_refs = [[labels[j] for j in rows] for rows in env_rows]
    engine_x = _crossings(grid, env, env_refs) if len(engines) > 1 else []
    points = sorted(set(body.points or np.unique(np.geomspace(lo, hi, DEFAULT_POINTS)
                                                 .round().astype(int)).tolist()))
    at = total_curves(model, w, layout, cfgs, np.array(points, dtype=float))
    best = [labels[j] for j in np.argmin(np.where(np.isfinite(at), at, np.inf), axis=0)]
    curves = [Curve(engine=c.engine, dcp_size=c.dcp_size, calibrated=e.pred.calibrated,
                    total_s=[x if np.isfinite(x) else None for x in at[k].tolist()])
              for k, (c, e) in enumerate(zip(cfgs, ok, strict=True))]
    return CrossoverResponse(
        context_range=(lo, hi),
        crossover_context_tokens=engine_x[0].context_tokens if engine_x else None,
        engine_crossovers=engine_x, config_crossovers=_crossings(grid, totals, config_refs),
        points=points, best=best, curves=curves, excluded=list(q.excluded),
        model_version=loaded.version)
