"""The request body cap, with a separate (larger) one for the proxy routes.

The service's global cap (``max_body_bytes``, 1 MiB) suits /v1/recommend; a proxied prompt of a
long-context model is far larger. Proxy paths get ``ProxyState.body_cap()`` (the
``proxy_max_body_bytes`` setting, else enough for the longest context the pools serve, at
least 32 MiB); everything else keeps the global cap. Both use service.middleware's
BodyLimitMiddleware (413 at once on Content-Length, or while a chunked body streams in).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from service.middleware import BodyLimitMiddleware

PROXY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/route"})


class SplitBodyLimit:
    def __init__(self, app: ASGIApp, limit: int, proxy):
        self.default = BodyLimitMiddleware(app, limit)
        self.proxied = BodyLimitMiddleware(app, limit)
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in PROXY_PATHS:
            self.proxied.limit = self.proxy.body_cap()
            await self.proxied(scope, receive, send)
        else:
            await self.default(scope, receive, send)
