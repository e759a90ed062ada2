"""POST /v1/predict: the prediction of one explicit (engine, dcp_size) for a workload."""

from __future__ import annotations

from fastapi import APIRouter

from engine_advisor.model.queries import query_for
from engine_advisor.service.deps import JsonRoute, ModelDep
from engine_advisor.service.errors import ApiError, error_responses
from engine_advisor.service.schemas import PredictRequest, PredictResponse, StepSeconds

router = APIRouter(prefix="/v1/predict", tags=["predict"], route_class=JsonRoute)


@router.post("", response_model=PredictResponse, responses=error_responses(400, 413, 422, 503),
             summary="Predict times (with a 90 % interval) of one configuration")
async def predict(body: PredictRequest, loaded: ModelDep) -> PredictResponse:
    w = body.workload.model_copy(update={"engines": [body.engine], "dcp_sizes": [body.dcp_size]})
    q = query_for(loaded.model, w)
    if not q.configs:
        x = q.excluded[0]
        raise ApiError(422, f"{body.engine} dcp {body.dcp_size} cannot serve this workload: "
                            f"{x.reason}", param="dcp_size" if x.dcp_size else "engine")
    e = q.evaluate(w)[0]
    return PredictResponse(prediction=e.pred, decode_step_s=StepSeconds(**e.pred.step_terms_s),
                           model_version=loaded.version)
