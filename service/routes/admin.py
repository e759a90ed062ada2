"""GET /v1/model (metadata) and POST /v1/model/reload (admin token)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter

from engine_advisor.model.fit.artifact import ArtifactError
from engine_advisor.service.deps import (
    AdminDep,
    HolderDep,
    JsonRoute,
    MetricsDep,
    ModelDep,
    SettingsDep,
)
from engine_advisor.service.errors import ApiError, error_responses
from engine_advisor.service.schemas import ModelInfo, ReloadRequest, ReloadResponse
from engine_advisor.service.settings import Settings

router = APIRouter(prefix="/v1/model", tags=["model"], route_class=JsonRoute)


@router.get("", response_model=ModelInfo, responses=error_responses(503),
            summary="Metadata of the loaded model")
async def get_model(loaded: ModelDep) -> ModelInfo:
    m = loaded.meta
    return ModelInfo(
        model_version=loaded.version, source=loaded.source, loaded_at=loaded.loaded_at,
        created=m.get("created"), engine_advisor_version=m.get("engine_advisor_version"),
        artifact_sha256=m.get("artifact_sha256"), training_data_sha256=loaded.model.data_sha256,
        engines=loaded.model.engine_names, sources=list(loaded.model.sources),
        calibrated_ranges=loaded.model.ranges, calibrated_points=loaded.model.points,
        fit_metrics=loaded.model.metrics, memory_fractions=loaded.model.memory,
        efficiencies={k: est.coefficients_ for k, est in loaded.model.engines.items()},
        hardware=loaded.model.hardware, roofline_warnings=loaded.model.roofline_warnings)


def allowed_path(settings: Settings, raw: str | None) -> Path:
    """The artifact the request names, if the operator allowed it; never any other file."""
    if raw is None:
        if settings.model_path is None:
            raise ApiError(422, "path: required (no model_path is configured to reload)",
                           param="path")
        return settings.model_path
    if "\x00" in raw:
        raise ApiError(422, "path: contains a NUL byte", param="path")
    p = Path(raw)
    if not p.is_absolute() and settings.models_dir is not None:
        p = settings.models_dir / p
    resolved = p.resolve()
    if settings.model_path is not None and resolved == settings.model_path.resolve():
        return resolved
    if settings.models_dir is not None:
        root = settings.models_dir.resolve()
        if resolved != root and resolved.is_relative_to(root):
            return resolved
    raise ApiError(403, "path: not allowed; reload loads only the configured model_path or a "
                        "file inside the configured models_dir", param="path")


@router.post("/reload", response_model=ReloadResponse,
             responses=error_responses(400, 401, 403, 413, 422),
             summary="Load a new model artifact atomically (admin token)")
async def reload_model(_: AdminDep, holder: HolderDep, settings: SettingsDep,
                       metrics: MetricsDep, body: ReloadRequest | None = None) -> ReloadResponse:
    path = allowed_path(settings, body.path if body else None)
    previous = holder.current
    try:
        loaded = await holder.reload(path)
    except (ArtifactError, OSError) as exc:
        metrics.reloads.labels("failed").inc()
        raise ApiError(422, f"{exc}; still serving model {previous.version}", param="path",
                       type="invalid_artifact") from None
    metrics.reloads.labels("ok").inc()
    metrics.set_model(loaded.version, loaded.source)
    return ReloadResponse(model_version=loaded.version, previous_version=previous.version,
                          source=loaded.source, loaded_at=loaded.loaded_at)
