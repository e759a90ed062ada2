"""OpenAI-compatible proxy routes: POST /v1/chat/completions, POST /v1/completions,
GET /v1/models; pool administration: GET /v1/upstreams, POST /v1/upstreams/reload (admin)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from starlette.types import Receive, Scope

from service.deps import AdminDep, model_of
from service.errors import ApiError, error_responses
from service.proxy.forward import ProxyCall
from service.proxy.generate import GENERATE_BODY, handle_generate
from service.proxy.request import CHAT, COMPLETIONS, parse, read_body
from service.proxy.routing import NO_POOLS, authorize, current_pools, route
from service.proxy.schemas import ModelCard, ModelList, ReloadResult, UpstreamsStatus
from service.proxy.state import ProxyState

router = APIRouter(tags=["proxy"])

OPENAI_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "additionalProperties": True,
    "description": "an OpenAI request, forwarded unchanged to the chosen upstream"}}}}}
PROXY_ERRORS = error_responses(400, 401, 404, 413, 422, 502, 503, 504)
PASSED = {200: {"description": "the upstream's answer, passed through (JSON, or "
                               "text/event-stream when streaming)",
                "content": {"application/json": {}, "text/event-stream": {}}}}


async def handle(request: Request, path: str) -> Response:
    """Both completion routes."""
    return await forward(request.scope, request.receive, path)


async def forward(scope: Scope, receive: Receive, path: str, body: bytes | None = None,
                  st: ProxyState | None = None) -> ProxyCall:
    """A completion request to its ``ProxyCall`` (service.proxy.asgi calls this directly);
    ``body``: the whole request body when the caller has read it already; ``st``: the app's
    proxy state, when the caller has it."""
    state = scope["app"].state
    if st is None:
        st = state.proxy
    pools = st.pools
    if pools is None:
        raise ApiError(503, NO_POOLS)
    if pools.api_keys:
        authorize(pools, Request(scope))
    req = parse(body if body is not None else await read_body(receive, st.body_cap()), path)
    routed = await route(st, pools, model_of(state), req)
    rid = scope.get("state", {}).get("request_id") or ""
    return ProxyCall(st, pools, req, routed.decision, routed.first, rid, routed.prompt_tokens)


@router.post("/v1/chat/completions", response_class=Response, responses={**PASSED, **PROXY_ERRORS},
             openapi_extra=OPENAI_BODY,
             summary="Chat completion, forwarded to the engine pool the cost model picks")
async def chat_completions(request: Request) -> Response:
    return await handle(request, CHAT)


@router.post("/v1/completions", response_class=Response, responses={**PASSED, **PROXY_ERRORS},
             openapi_extra=OPENAI_BODY,
             summary="Text completion, forwarded to the engine pool the cost model picks")
async def completions(request: Request) -> Response:
    return await handle(request, COMPLETIONS)


@router.post("/generate", response_class=Response, responses={**PASSED, **PROXY_ERRORS},
             openapi_extra=GENERATE_BODY,
             summary="SGLang's native generate API, forwarded to the SGLang pool the cost model "
                     "picks")
async def generate(request: Request) -> Response:
    return await handle_generate(request)


@router.get("/v1/models", response_model=ModelList, responses=error_responses(401, 503),
            summary="Models served by the upstream pools (their union)")
async def list_models(request: Request) -> ModelList:
    st, pools = current_pools(request)
    authorize(pools, request)
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
