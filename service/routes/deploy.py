"""POST /v1/deploy: the recommendation as deployment files (model/presentation/deploy.py), YAML."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from engine_advisor.model.presentation.deploy import (
    DeployError,
    DeployOptions,
    default_name,
    render,
)
from engine_advisor.model.workload import Workload
from engine_advisor.service.deps import JsonRoute, ModelDep
from engine_advisor.service.errors import ApiError, error_responses
from engine_advisor.service.routes.recommend import recommend_or_422

router = APIRouter(prefix="/v1/deploy", tags=["deploy"], route_class=JsonRoute)

YAML = "application/yaml"


@router.post("", response_class=Response, responses={
    200: {"content": {YAML: {"schema": {"type": "string"}}},
          "description": "format=k8s: a Deployment and a Service (two YAML documents); "
                         "format=compose: a compose file with one service"},
    **error_responses(400, 413, 422, 503)},
    summary="Deployment files (Kubernetes or docker compose) for the recommended configuration")
async def deploy(workload: Workload, opts: Annotated[DeployOptions, Query()],
                 loaded: ModelDep) -> Response:
    rec = recommend_or_422(loaded, workload)
    try:
        text = render(rec, workload, opts)
    except DeployError as exc:
        raise ApiError(422, str(exc), param=exc.field) from None
    filename = f"{opts.name or default_name(rec, workload)}-{opts.format}.yaml"
    return Response(text, media_type=YAML,
                    headers={"Content-Disposition": f'attachment; filename="{filename}"'})
