"""POST /v1/route: the proxy's routing decision for a request
(engine_advisor.service.proxy.decision), without proxying it (for gateways that route
themselves)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import ValidationError

from engine_advisor.service.deps import current_model, current_pools
from engine_advisor.service.errors import ApiError, error_responses, validation_detail
from engine_advisor.service.proxy.auth import authorize
from engine_advisor.service.proxy.decision import PoolCost, choose
from engine_advisor.service.proxy.request import CHAT, COMPLETIONS, ProxyRequest, decode, parse
from engine_advisor.service.proxy.schemas import (
    Alternative,
    Predicted,
    RouteDecision,
    RouteWorkload,
)

router = APIRouter(prefix="/v1/route", tags=["route"])

BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {"anyOf": [
    {"type": "object", "description": "an OpenAI chat (messages) or completions (prompt) "
                                      "request body, as it would be proxied"},
    {"$ref": "#/components/schemas/RouteWorkload"}]}}}}}


def _predicted(p: PoolCost | None) -> Predicted | None:
    if p is None:
        return None
    return Predicted(ttft_s=p.prefill_s, tpot_s=p.tpot_s, total_s=p.total_s,
                     interval_s=p.interval_s, calibrated=p.calibrated)


def _request(raw: bytes) -> tuple[ProxyRequest, int | None]:
    data = decode(raw)
    if isinstance(data, dict) and "context_tokens" in data:
        try:
            w = RouteWorkload.model_validate(data)
        except ValidationError as exc:
            message, param = validation_detail(exc.errors())
            raise ApiError(422, message, param=param) from None
        return ProxyRequest(COMPLETIONS, raw, data, w.model, False, w.output_tokens, None,
                            0), w.context_tokens
    path = CHAT if isinstance(data, dict) and "messages" in data else COMPLETIONS
    return parse(raw, path, data), None


@router.post("", response_model=RouteDecision, responses=error_responses(400, 401, 404, 413,
                                                                          422, 503),
             openapi_extra=BODY, summary="The engine, DCP size and upstream a request would "
                                         "be routed to, with predictions, without proxying it")
async def route_request(request: Request) -> RouteDecision:
    st, pools = current_pools(request)
    authorize(pools, request.headers.get("authorization", ""))
    req, context = _request(await request.body())
    r = await choose(st, pools, current_model(request), req, context)
    d, up = r.decision, r.first
    alts = [Alternative(engine=g[0], dcp_size=g[1], predicted=_predicted(d.predictions.get(g)))
            for g in d.ranked if g != up.group]
    return RouteDecision(
        engine=up.engine, dcp_size=up.spec.dcp_size, upstream=up.name, upstream_url=up.url,
        model=up.spec.model, prompt_tokens=r.prompt_tokens, prompt_tokens_method=r.method,
        output_tokens=r.output_tokens, batch_size=r.batch_size,
        predicted=_predicted(d.predictions.get(up.group)),
        confidence=d.confidence if up.group == d.best else "low", alternatives=alts,
        model_version=d.model_version, note=d.note)
