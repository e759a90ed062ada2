"""POST /v1/recommend and /v1/recommend/batch."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from engine_advisor.model.errors import NoEligibleConfiguration
from engine_advisor.model.recommend import recommend
from engine_advisor.model.schemas import Recommendation, to_json
from engine_advisor.model.workload import Workload
from engine_advisor.service.cache import cache_key
from engine_advisor.service.deps import (
    JsonRoute,
    MetricsDep,
    ModelDep,
    SettingsDep,
    hot_state,
    json_body,
)
from engine_advisor.service.errors import ApiError, ErrorDetail, error_responses, validation_detail
from engine_advisor.service.schemas import BatchItem, BatchRequest, BatchResponse

router = APIRouter(prefix="/v1/recommend", tags=["recommend"], route_class=JsonRoute)
WORKLOAD_BODY = {"requestBody": {"content": {"application/json": {"schema": {
    "$ref": "#/components/schemas/Workload"}}}, "required": True}}


def recommend_or_422(loaded, w: Workload) -> Recommendation:
    """The recommendation, or the 422 envelope naming the field to change: the one that
    excludes every configuration, or ``num_gpus`` / ``context_tokens`` when the model or one
    sequence does not fit."""
    try:
        return recommend(loaded.model, w, loaded.version)
    except NoEligibleConfiguration as exc:
        raise ApiError(422, f"{exc.field}: {exc}", param=exc.field,
                       type="no_eligible_configuration") from None


@router.post("", response_model=Recommendation, responses=error_responses(400, 413, 422, 503),
             openapi_extra=WORKLOAD_BODY,
             summary="Recommend engine, DCP size and memory fraction for one workload")
async def recommend_one(request: Request) -> Response:
    # The hot path (docs/benchmarks.md has the measurements): body and state read without FastAPI's
    # dependency solving, the recommender run inline (a thread hop costs about as much), the answer
    # written by orjson (engine_advisor.model.schemas.to_json) instead of re-validated by
    # response_model.
    workload = await json_body(request, Workload)
    loaded, metrics, cache = hot_state(request)
    key = (loaded.version, cache_key(workload.__pydantic_serializer__.to_json(workload)))
    hit = cache.get(key)
    if hit is None:
        rec = recommend_or_422(loaded, workload)
        hit = (to_json(rec), (rec.engine, str(rec.dcp_size)))
        cache.put(key, hit)
    metrics.recommendations.inc(hit[1])
    return Response(hit[0], media_type="application/json")


def _batch(loaded, items: list, metrics) -> BatchResponse:
    results = []
    for i, raw in enumerate(items):
        try:
            rec = recommend_or_422(loaded, Workload.model_validate(raw))
        except ValidationError as exc:
            message, param = validation_detail(exc.errors(), prefix=f"workloads.{i}")
            err = ErrorDetail(message=message, type="invalid_request_error", param=param, code=422)
            results.append(BatchItem(index=i, error=err))
            continue
        except ApiError as exc:
            err = exc.detail()
            err.param = f"workloads.{i}.{exc.param}" if exc.param else f"workloads.{i}"
            err.message = f"workloads.{i}.{exc.message}" if exc.param else exc.message
            results.append(BatchItem(index=i, error=err))
            continue
        metrics.recommendations.inc((rec.engine, str(rec.dcp_size)))
        results.append(BatchItem(index=i, recommendation=rec))
    ok = sum(r.error is None for r in results)
    return BatchResponse(results=results, succeeded=ok, failed=len(results) - ok)


@router.post("/batch", response_model=BatchResponse, responses=error_responses(400, 413, 422, 503),
             summary="Recommend for many workloads; a bad item gets its own error")
async def recommend_batch(body: BatchRequest, loaded: ModelDep, settings: SettingsDep,
                          metrics: MetricsDep) -> Response:
    if len(body.workloads) > settings.max_batch:
        raise ApiError(422, f"workloads: {len(body.workloads)} items exceed the batch limit of "
                            f"{settings.max_batch}", param="workloads")
    out = await run_in_threadpool(_batch, loaded, body.workloads, metrics)
    return Response(to_json(out), media_type="application/json")
