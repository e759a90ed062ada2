"""From a parsed request to a decision and a first upstream (shared by the proxy routes and
POST /v1/route)."""

from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import Request

from service.errors import ApiError
from service.holder import LoadedModel
from service.proxy.decide import Decision
from service.proxy.forward import pick
from service.proxy.request import ProxyRequest
from service.proxy.tokens import MAX_BYTES_PER_TOKEN, local_count, upstream_count
from service.proxy.upstreams import Pools, Upstream

if TYPE_CHECKING:
    from service.proxy.state import ProxyState

NO_POOLS = ("the proxy has no upstream pools: start `engine-advisor serve --upstreams FILE` "
            "or set ENGINE_ADVISOR_UPSTREAMS")
LOCAL_INLINE_BYTES = 64 << 10      # larger prompts are tokenized off the event loop


@dataclass(slots=True)
class Routed:
    decision: Decision
    first: Upstream
    prompt_tokens: int
    method: str
    output_tokens: int
    batch_size: int


def current_pools(request: Request) -> tuple[ProxyState, Pools]:
    st: ProxyState = request.app.state.proxy
    if st.pools is None:
        raise ApiError(503, NO_POOLS)
    return st, st.pools


def authorize(pools: Pools, request: Request) -> None:
    """Client API keys (``client_api_keys`` in the pools file), compared in constant time."""
    if not pools.api_keys:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(401, "missing API key: send 'Authorization: Bearer <key>'",
                       param="authorization", headers={"WWW-Authenticate": "Bearer"})
    g = given.strip().encode()
    ok = False
    for key in pools.api_keys:      # no early exit: every key is compared
        ok |= hmac.compare_digest(g, key)
    if not ok:
        raise ApiError(401, "invalid API key", param="authorization",
                       headers={"WWW-Authenticate": "Bearer"})


def _why_unavailable(u: Upstream, now: float) -> str:
    if not u.healthy:
        return f"down ({u.last_error or 'failed health checks'})"
    if now < u.not_before:
        return f"asked to wait (Retry-After) {u.not_before - now:.1f} s more"
    return f"circuit breaker {u.breaker.state}"


def _unavailable(cands: list[Upstream]) -> ApiError:
    now = time.monotonic()
    return ApiError(503, "no upstream is available: " + "; ".join(
        f"{u.name}: {_why_unavailable(u, now)}" for u in cands))


async def route(st: ProxyState, pools: Pools, loaded: LoadedModel, req: ProxyRequest,
                context_tokens: int | None = None) -> Routed:
    cfg = pools.config
    if req.model is None and len(pools.models) > 1:
        raise ApiError(400, f"model: required (served: {', '.join(pools.models)})",
                       param="model")
    cands = pools.serving(req.model)
    if not cands:
        raise ApiError(404, f"model: {req.model!r} is not served by any pool (served: "
                            f"{', '.join(pools.models)})", param="model", type="model_not_found")
    now = time.monotonic()
    least = None                  # the fewest requests in flight of an available upstream
    for u in cands:
        if u.available(now) and (least is None or u.in_flight < least):
            least = u.in_flight
    if least is None:
        raise _unavailable(cands)
    out = req.max_tokens or cfg.workload.output_tokens
    batch = cfg.workload.batch_size
    if least >= batch:                  # max(batch, 1 + least); max() is a slow builtin call
        batch = least + 1
    decision = None
    if context_tokens is not None:
        n, method = context_tokens, "given"
    elif req.prompt_token_ids is not None:
        n, method = req.prompt_token_ids, "token_ids"
    elif st.tokenizer is not None:
        if req.prompt_bytes > LOCAL_INLINE_BYTES:
            n = await asyncio.to_thread(local_count, st.tokenizer, req)
        else:
            n = local_count(st.tokenizer, req)
        method = "tokenizer"
    else:
        size = req.prompt_bytes   # the estimate and its plausible range (service.proxy.tokens)
        n, method = round(size / cfg.tokens.bytes_per_token) or 1, "estimate"
        lo, hi = size // MAX_BYTES_PER_TOKEN or 1, size or 1
        decision, differs = st.decider.estimated(loaded, pools, n, lo, hi, out, batch,
                                                 cfg.tokens.upstream_tokenize)
        if differs:
            asker = min((u for u in cands if u.available(now)), key=lambda u: u.in_flight)
            counted = await upstream_count(asker, req, cfg.tokens.tokenize_timeout_s)
            if counted is not None:
                n, method = counted, "upstream"
                decision = None
    st.metrics.token_counts.inc((method,))
    if decision is None:
        decision = st.decider.decide(loaded, pools, n, out, batch)
    st.seq += 1
    first = pick(pools, decision, req.model, [], None, st.seq)
    if first is None:     # every available upstream went away while we counted
        raise _unavailable(cands)
    st.metrics.decisions.inc(first.group_labels)
    return Routed(decision, first, n, method, out, batch)
