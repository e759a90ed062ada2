"""The picker's only bridge to the proxy: the decision ``POST /v1/route`` makes, and the live
upstream state that decision reads (in-flight counts, circuit breakers, Retry-After).

``pick_endpoints`` runs ``engine_advisor.service.proxy.decision.choose_now`` (client API keys,
token counting with its cache and /tokenize, the cost model's ranking of the pools, health,
breakers, the least-loaded upstream of the best group; it returns an awaitable only where the
decision waits for a prompt count, so a decision from an estimate or token ids costs no
coroutine) and then lists the fallbacks the proxy itself would retry,
in its order: ``engine_advisor.service.proxy.decision.pick`` again with the upstreams already listed
excluded (the chosen engine's other upstreams first, the other engine's only with
``retries.other_engine``), ``retries.max_attempts`` endpoints at most. Listing fallbacks does not
advance the round-robin of ties (those picks take no turn).

Everything else in ``engine_advisor.service.epp`` talks to the proxy through this module only.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass

from engine_advisor.service.errors import ApiError
from engine_advisor.service.holder import LoadedModel
from engine_advisor.service.proxy.auth import authorize
from engine_advisor.service.proxy.decision import Choice, Counting, choose_now, pick
from engine_advisor.service.proxy.request import CHAT, COMPLETIONS, ProxyRequest, parse
from engine_advisor.service.proxy.state import NO_POOLS, ProxyState
from engine_advisor.service.proxy.upstreams import Pools, Upstream

ROUTED_PATHS = frozenset({CHAT, COMPLETIONS})
RETRY_AFTER_CAP = 10      # x retries.backoff_max_s, as the proxy caps an engine's Retry-After


@dataclass
class Picked:
    upstreams: list[Upstream]     # primary first, then the fallbacks in order
    prompt_tokens: int
    method: str                   # how the prompt was counted (as /v1/route says)


def _shedding(state: ProxyState, model: str | None) -> float | None:
    """Seconds to wait when every candidate is out only because it asked to (Retry-After)."""
    pools = state.pools
    now = time.monotonic()
    cands = pools.serving(model)
    if cands and all(u.healthy and u.breaker.available() and u.not_before > now
                     for u in cands):
        return min(u.not_before for u in cands) - now
    return None


def pick_endpoints(state: ProxyState, loaded: LoadedModel, path: str, raw: bytes,
                   headers: Mapping[str, str], counts=None) -> Picked | Awaitable[Picked]:
    """The upstreams for one OpenAI request (``path`` one of ``ROUTED_PATHS``): a ``Picked``,
    or, where the decision waits for a prompt count, an awaitable of it. Raises ``ApiError``
    as ``POST /v1/route`` would, or 429 with Retry-After when every upstream of the model
    asked to wait. ``counts``: the other workers' in-flight picks
    (``engine_advisor.service.epp.shared``) are added to the counts first."""
    pools = state.pools
    if pools is None:
        raise ApiError(503, NO_POOLS)
    if counts is not None:
        counts.sync(pools)
    if pools.api_keys:
        authorize(pools, headers.get("authorization", ""))
    req = parse(raw, path)
    try:
        chosen = choose_now(state, pools, loaded, req)
    except ApiError as exc:
        _shed(state, req.model, exc)
        raise
    if type(chosen) is Counting:
        return _counted(state, pools, req, chosen)
    return _listed(pools, chosen, req.model)


async def _counted(state: ProxyState, pools: Pools, req: ProxyRequest,
                   counting: Counting) -> Picked:
    try:
        chosen = await counting.count()
    except ApiError as exc:
        _shed(state, req.model, exc)
        raise
    return _listed(pools, chosen, req.model)


def _shed(state: ProxyState, model: str | None, exc: ApiError) -> None:
    """A 503 because every candidate is out only because it asked to wait (Retry-After)
    becomes that 429."""
    wait = _shedding(state, model) if exc.status == 503 else None
    if wait is not None:
        raise ApiError(429, "every upstream asked to wait (Retry-After): " + exc.message,
                       headers={"Retry-After": str(max(1, round(wait)))}) from None


def _listed(pools: Pools, chosen: Choice, model: str | None) -> Picked:
    """The choice's upstream, then the fallbacks the proxy would retry, in its order."""
    first = chosen.first
    listed = [first]
    retries = pools.config.retries
    # as many as the attempts allow, and the model's upstreams hold
    most = min(retries.max_attempts, len(pools.serving(model)))
    if most > 1:
        engine = None if retries.other_engine else first.engine
        while len(listed) < most:
            nxt = pick(pools, chosen.decision, model, listed, engine, None)
            if nxt is None:
                break
            listed.append(nxt)
    return Picked(listed, chosen.prompt_tokens, chosen.method)


def sent(state: ProxyState, up: Upstream, counts) -> bool:
    """A request goes to ``up``: one more in flight (published to the other workers through
    ``counts``); True when it is the half-open breaker's probe."""
    up.in_flight += 1
    counts.add(state.pools, up, 1)
    return up.breaker.acquire()


def done(state: ProxyState, up: Upstream, probe: bool, counts) -> None:
    """The request that ``sent`` counted ended; ``probe``: it was the breaker's probe and no
    report settled it (the breaker takes the next request as its probe)."""
    up.in_flight -= 1
    counts.add(state.pools, up, -1)
    if probe:
        up.breaker.release()


def sync(state: ProxyState, counts) -> None:
    """The other workers' in-flight picks, added to the counts (also between decisions)."""
    counts.sync(state.pools)


def served(state: ProxyState, listed: list[Upstream], up: Upstream | None, status: int,
           retry_after: float | None) -> None:
    """The gateway's report of a response: ``up`` (one of ``listed``, or None when unknown)
    answered ``status``. Endpoints listed before it failed (the gateway went past them);
    a 429 or 5xx counts against ``up``'s breaker, Retry-After holds it back."""
    if up is None:
        return
    if up is not listed[0] and up in listed:
        for before in listed[:listed.index(up)]:
            before.breaker.failure()
    if status == 429 or status >= 500:
        up.breaker.failure()
        if retry_after:
            cap = state.pools.config.retries.backoff_max_s * RETRY_AFTER_CAP \
                if state.pools is not None else retry_after
            up.not_before = time.monotonic() + min(retry_after, cap)
    else:
        up.breaker.success()


def upstreams(state: ProxyState) -> list[Upstream]:
    return state.pools.upstreams if state.pools is not None else []


def generation(state: ProxyState) -> int | None:
    return state.pools.generation if state.pools is not None else None


def body_cap(state: ProxyState) -> int:
    return state.body_cap()
