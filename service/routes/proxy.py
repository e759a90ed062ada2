"""The proxy's endpoints: GET /v1/models; pool administration: GET /v1/upstreams, POST
/v1/upstreams/reload (admin); and the OpenAPI description of POST /v1/chat/completions,
/v1/completions and /generate, which engine_advisor.service.main.App hands to the proxy's entrance
(engine_advisor.service.proxy.entrance) before FastAPI routes anything: their handlers here are
never called."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from engine_advisor.service.deps import AdminDep, current_pools
from engine_advisor.service.errors import ApiError, error_responses
from engine_advisor.service.proxy.auth import authorize
from engine_advisor.service.proxy.generate import GENERATE_BODY
from engine_advisor.service.proxy.schemas import ModelCard, ModelList, ReloadResult, UpstreamsStatus
from engine_advisor.service.proxy.state import NO_POOLS

router = APIRouter(tags=["proxy"])

OPENAI_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "additionalProperties": True,
    "description": "an OpenAI request, forwarded unchanged to the chosen upstream"}}}}}
PROXY_ERRORS = error_responses(400, 401, 404, 413, 422, 502, 503, 504)
PASSED = {200: {"description": "the upstream's answer, passed through (JSON, or "
                               "text/event-stream when streaming)",
                "content": {"application/json": {}, "text/event-stream": {}}}}


async def _entrance_only(request: Request) -> Response:
    raise RuntimeError(f"{request.url.path} is served by engine_advisor.service.proxy.entrance, "
                       "which engine_advisor.service.main.App dispatches to before FastAPI")


@router.post("/v1/chat/completions", response_class=Response, responses={**PASSED, **PROXY_ERRORS},
             openapi_extra=OPENAI_BODY,
             summary="Chat completion, forwarded to the engine pool the cost model picks")
async def chat_completions(request: Request) -> Response:
    return await _entrance_only(request)


@router.post("/v1/completions", response_class=Response, responses={**PASSED, **PROXY_ERRORS},
             openapi_extra=OPENAI_BODY,
             summary="Text completion, forwarded to the engine pool the cost model picks")
async def completions(request: Request) -> Response:
    return await _entrance_only(request)


@router.post("/generate", response_class=Response, responses={**PASSED, **PROXY_ERRORS},
             openapi_extra=GENERATE_BODY,
             summary="SGLang's native generate API, forwarded to the SGLang pool the cost model "
                     "picks")
async def generate(request: Request) -> Response:
    return await _entrance_only(request)


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401, 503),
            summary="Models served by the upstream pools (their union)")
async def list_models(request: Request) -> ModelList:
    st, pools = current_pools(request)
    authorize(pools, request.headers.get("authorization", ""))
    cards = []
    for m in pools.models:
        cards.append(ModelCard(id=m, created=int(pools.loaded_at),
                               engines=sorted({u.engine for u in pools.serving(m)}),
                               max_model_len=pools.max_model_len(m)))
    return ModelList(data=cards)


@router.get("/v1/upstreams", response_model=UpstreamsStatus,
            responses=error_responses(401, 403, 503),
            summary="Pools, upstream health, circuit breakers and load (admin token)")
async def list_upstreams(_: AdminDep, request: Request) -> UpstreamsStatus:
    st, _ = current_pools(request)
    return UpstreamsStatus.of(st, time.monotonic())


@router.post("/v1/upstreams/reload", response_model=ReloadResult,
             responses=error_responses(401, 403, 413, 422, 503),
             summary="Re-read the pools file; a bad file keeps the current pools (admin token)")
async def reload_upstreams(_: AdminDep, request: Request) -> ReloadResult:
    st = request.app.state.proxy
    if st.path is None:
        raise ApiError(503, NO_POOLS)
    ok, message = await st.load("admin")
    if not ok:
        raise ApiError(422, message, param="upstreams", type="invalid_upstreams")
    return ReloadResult(message=message, generation=st.pools.generation,
                        upstreams=[u.name for u in st.pools.upstreams])
