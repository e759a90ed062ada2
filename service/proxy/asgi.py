"""The proxy's ASGI layers: its own body cap, and a direct path to the completion handlers.

- Body cap: the service's global cap (``max_body_bytes``, 1 MiB) suits /v1/recommend; a
  proxied prompt of a long-context model is far larger. Proxy paths get
  ``ProxyState.body_cap()`` (the ``proxy_max_body_bytes`` setting, else enough for the longest
  context the pools serve, at least 32 MiB); every other path keeps the global cap. Both use
  service.middleware's BodyLimitMiddleware (413 at once on Content-Length, or while a chunked
  body streams in). ``ProxyMiddleware`` applies it inside FastAPI; ``DirectPath`` on its own.
- Direct path: ``POST /v1/chat/completions`` and ``/v1/completions`` are dispatched by the app
  itself (service.main.App) before FastAPI sees them, to ``DirectPath``: request ids, metrics
  and the body cap (the same middleware classes the app uses), then the handler the FastAPI
  routes also call (service.proxy.routes.handle). FastAPI's own layers (telemetry checks,
  server-error and exception middleware, route matching, dependency solving) are a large share
  of the proxy's CPU per request (bench/bench_proxy.py) and are skipped; errors become the
  same envelope, and an unexpected exception a logged 500.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import ApiError, envelope, internal_error
from service.metrics import Metrics
from service.middleware import BodyLimitMiddleware, MetricsMiddleware, RequestIdMiddleware

if TYPE_CHECKING:
    from service.proxy.state import ProxyState

Handler = Callable[[Request, str], Awaitable[Response]]

PROXY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/route", "/generate"})
DIRECT_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


class _Template:
    """What MetricsMiddleware reads from ``scope["route"]``: the route template."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path


ROUTES = {p: _Template(p) for p in DIRECT_PATHS}


class ProxyMiddleware:
    """Inside FastAPI: the proxy's body cap on proxy paths, the global one elsewhere."""

    def __init__(self, app: ASGIApp, limit: int, proxy: ProxyState):
        self.default = BodyLimitMiddleware(app, limit)
        self.capped = BodyLimitMiddleware(app, limit)
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in PROXY_PATHS:
            self.capped.limit = self.proxy.body_cap()
            await self.capped(scope, receive, send)
        else:
            await self.default(scope, receive, send)


class DirectPath:
    """ASGI app of the completion routes, called by service.main.App (see the docstring)."""

    def __init__(self, proxy: ProxyState, metrics: Metrics, handler: Handler):
        self.proxy, self.handler = proxy, handler
        self.capped = BodyLimitMiddleware(self._handle, 0)
        self.app = RequestIdMiddleware(MetricsMiddleware(self.capped, metrics))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["route"] = ROUTES[scope["path"]]
        self.capped.limit = self.proxy.body_cap()
        await self.app(scope, receive, send)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            response = await self.handler(Request(scope, receive, send), scope["path"])
        except ApiError as exc:
            response = exc.response()
        except HTTPException as exc:      # the body cap, raised while the body streams in
            response = envelope(exc.status_code, str(exc.detail), headers=exc.headers)
        except ClientDisconnect:          # gone before its body arrived: nobody to answer
            return
        except Exception:
            response = internal_error(scope["method"], scope["path"])
        await response(scope, receive, send)
