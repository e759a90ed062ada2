"""GET /v1/observations: proxied requests as calibration dataset rows (CSV, admin token)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from engine_advisor.service.deps import AdminDep
from engine_advisor.service.errors import error_responses

router = APIRouter(prefix="/v1/observations", tags=["proxy"])


@router.get("", response_class=Response, responses={
    200: {"description": "model/fit/dataset.py's CSV, one row per observed request (the most "
                         "recent, up to the pools file's observations setting)",
          "content": {"text/csv": {}}}, **error_responses(401, 403)},
    summary="Observed context, output tokens, TTFT and TPOT per engine and upstream, as "
            "calibration rows for `engine-advisor fit` (admin token)")
async def get_observations(_: AdminDep, request: Request) -> Response:
    st = request.app.state.proxy
    return Response(st.observations.csv(), media_type="text/csv; charset=utf-8",
                    headers={"content-disposition": 'attachment; filename="observations.csv"'})
