"""GET /healthz (alive), /readyz (model loaded), /metrics (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engine_advisor.service.deps import MetricsDep, current_model
from engine_advisor.service.errors import error_responses
from engine_advisor.service.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses=error_responses(503),
            summary="Readiness: the model is loaded")
async def readyz(request: Request) -> Health:
    return Health(status="ready", model_version=current_model(request).version)


@router.get("/metrics", response_class=Response, summary="Prometheus metrics",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(m: MetricsDep) -> Response:
    return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)
