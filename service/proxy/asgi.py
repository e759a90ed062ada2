"""The proxy's ASGI middleware: its own body cap, and a direct path to the proxy handlers.

- Body cap: the service's global cap (``max_body_bytes``, 1 MiB) suits /v1/recommend; a
  proxied prompt of a long-context model is far larger. Proxy paths get
  ``ProxyState.body_cap()`` (the ``proxy_max_body_bytes`` setting, else enough for the longest
  context the pools serve, at least 32 MiB); every other path keeps the global cap. Both use
  service.middleware's BodyLimitMiddleware (413 at once on Content-Length, or while a chunked
  body streams in).
- Direct path: POST /v1/chat/completions and /v1/completions go straight to the handler the
  FastAPI routes also use (service.routes.proxy.handle), skipping route matching, the
  exception middleware and dependency solving (about a fifth of the proxy's CPU per request,
  bench/bench_proxy.py). Request ids, metrics and the body cap still apply: this middleware
  sits inside them. Errors become the same envelope.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ApiError, envelope
from service.middleware import BodyLimitMiddleware

PROXY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/route"})


class _Template:
    """What MetricsMiddleware reads from ``scope["route"]``: the route template."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path


ROUTES = {p: _Template(p) for p in PROXY_PATHS}


class ProxyMiddleware:
    def __init__(self, app: ASGIApp, limit: int, proxy, handler=None):
        self.default = BodyLimitMiddleware(app, limit)
        self.capped = BodyLimitMiddleware(self._direct, limit)
        self.app, self.proxy, self.handler = app, proxy, handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in PROXY_PATHS:
            self.capped.limit = self.proxy.body_cap()
            await self.capped(scope, receive, send)
        else:
            await self.default(scope, receive, send)

    async def _direct(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        if self.handler is None or scope["method"] != "POST" or path == "/v1/route":
            await self.app(scope, receive, send)
            return
        scope["route"] = ROUTES[path]
        try:
            response = await self.handler(Request(scope, receive, send), path)
        except ApiError as exc:
            response = exc.response()
        except HTTPException as exc:      # the body cap, raised while the body streams in
            response = envelope(exc.status_code, str(exc.detail), headers=exc.headers)
        await response(scope, receive, send)
