"""POST /v1/plan: capacity planning for a traffic mix under an SLO (model/plan.py)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from engine_advisor.model.plan import PlanRequest, PlanResult, plan
from engine_advisor.service.deps import JsonRoute, ModelDep
from engine_advisor.service.errors import error_responses

router = APIRouter(prefix="/v1/plan", tags=["plan"], route_class=JsonRoute)


@router.post("", response_model=PlanResult, responses=error_responses(400, 413, 422, 503),
             summary="Engine, DCP, memory fraction, concurrency and node count per request class")
async def plan_capacity(body: PlanRequest, loaded: ModelDep) -> PlanResult:
    return await run_in_threadpool(plan, loaded.model, body, loaded.version)
