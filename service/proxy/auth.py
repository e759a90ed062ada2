"""Client API keys: ``client_api_keys`` in the pools file, asked of every proxy request."""

from __future__ import annotations

import hmac

from engine_advisor.service.errors import ApiError
from engine_advisor.service.proxy.upstreams import Pools


def authorize(pools: Pools, authorization: str) -> None:
    """``authorization``: the request's Authorization header ("" when absent); its bearer key
    is compared with each configured key in constant time (401 when none matches)."""
    if not pools.api_keys:
        return
    scheme, _, given = authorization.partition(" ")
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


def authorization_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The first Authorization header of raw ASGI headers, as Starlette decodes it."""
    for k, v in headers:
        if k == b"authorization":
            return v.decode("latin-1")
    return ""
