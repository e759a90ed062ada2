"""The proxy's ASGI layers: its own body cap, and a direct path to the completion handlers.

- Body cap: the service's global cap (``max_body_bytes``, 1 MiB) suits /v1/recommend; a
  proxied prompt of a long-context model is far larger. Proxy paths get
  ``ProxyState.body_cap()`` (the ``proxy_max_body_bytes`` setting, else enough for the longest
  context the pools serve, at least 32 MiB); every other path keeps the global cap: 413 at once
  on Content-Length, or while a chunked body streams in. ``ProxyMiddleware`` applies it inside
  FastAPI (service.middleware's BodyLimitMiddleware); ``DirectPath`` checks the same itself.
- Direct path: ``POST /v1/chat/completions`` and ``/v1/completions`` are dispatched by the app
  itself (service.main.App) before FastAPI sees them, to ``DirectPath``: request ids, metrics
  and the body cap as the app's middleware gives every other route, then the handler the
  FastAPI routes also call (service.proxy.routes.forward). FastAPI's own layers (telemetry
  checks, server-error and exception middleware, route matching, dependency solving) and the
  middleware's wrappers around ``send`` and ``receive`` are a large share of the proxy's CPU
  per request (bench/bench_proxy.py) and are skipped; errors become the same envelope, and an
  unexpected exception a logged 500. Under ``engine-advisor serve`` the protocol's direct lane
  calls ``DirectPath.lane`` with its request cycle instead (service.server): whole responses
  are written as bytes there."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import ApiError, envelope, internal_error
from service.metrics import Metrics
from service.middleware import REQUEST_ID, BodyLimitMiddleware, body_too_large, request_id
from service.proxy.forward import ProxyCall

if TYPE_CHECKING:
    from service.proxy.state import ProxyState
    from service.server import DirectCycle

Handler = Callable[..., Awaitable[Response]]    # (scope, receive, path[, body, state])

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
    """ASGI app of the completion routes, called by service.main.App (see the docstring).

    One coroutine does what RequestIdMiddleware, MetricsMiddleware and BodyLimitMiddleware
    do around the other routes (a request id, the request metrics, the body cap: 400 or 413
    on Content-Length, 413 while the body streams in), without wrapping ``send`` or
    ``receive``: a proxied response (``ProxyCall``) adds the request id itself and tells its
    status; any other response (an error) goes through a ``send`` that adds the id."""

    def __init__(self, proxy: ProxyState, metrics: Metrics, handler: Handler):
        self.proxy, self.metrics, self.handler = proxy, metrics, handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()
        path = scope["path"]
        scope["route"] = ROUTES[path]
        rid, length = _id_and_length(scope["headers"])
        scope.setdefault("state", {})["request_id"] = rid.decode()
        status = 500
        try:
            try:
                response = self._refused(length) if length is not None else None
                if response is None:
                    response = await self.handler(scope, receive, path)
            except ApiError as exc:
                response = exc.response()
            except HTTPException as exc:
                response = envelope(exc.status_code, str(exc.detail), headers=exc.headers)
            except ClientDisconnect:      # gone before its body arrived: nobody to answer
                return
            except Exception:
                response = internal_error(scope["method"], path)
            if isinstance(response, ProxyCall):
                try:
                    await response(scope, receive, send)
                finally:
                    status = response.status_code
            else:
                status = response.status_code

                async def send_with_id(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        message["headers"] = [
                            *(h for h in message.get("headers", []) if h[0] != REQUEST_ID),
                            (REQUEST_ID, rid)]
                    await send(message)

                await response(scope, receive, send_with_id)
        finally:
            self.metrics.observe("POST", path, status, time.perf_counter() - start)

    async def lane(self, cycle: DirectCycle) -> None:
        """The same for a request of uvicorn's direct lane (service.server), on its cycle:
        a body that has all arrived is taken as it is, and a proxied whole response is
        written as bytes (``DirectCycle.respond``) instead of ASGI messages."""
        start = time.perf_counter()
        scope = cycle.scope
        path = scope["path"]
        scope["route"] = ROUTES[path]
        rid, length = _id_and_length(scope["headers"])
        scope["state"]["request_id"] = rid.decode()
        status = 500
        try:
            try:
                cap = self.proxy.body_cap()
                response = None
                if length is not None and not (length.isdigit() and int(length) <= cap):
                    response = self._refused(length, cap)
                if response is None:
                    body = cycle.whole_body()
                    if body is not None and len(body) > cap:
                        raise ApiError(413, body_too_large(cap, len(body), streamed=True))
                    response = await self.handler(scope, cycle.receive, path, body, self.proxy)
            except ApiError as exc:
                response = exc.response()
            except HTTPException as exc:
                response = envelope(exc.status_code, str(exc.detail), headers=exc.headers)
            except ClientDisconnect:
                return
            except Exception:
                response = internal_error(scope["method"], path)
            if isinstance(response, ProxyCall):
                try:
                    await response.on_cycle(cycle, cycle.task)
                finally:
                    status = response.status_code
            else:
                status = response.status_code
                response.headers[REQUEST_ID.decode()] = rid.decode()
                await response(scope, cycle.receive, cycle.send)
        finally:
            self.metrics.observe("POST", path, status, time.perf_counter() - start)

    def _refused(self, length: bytes, limit: int | None = None) -> Response | None:
        """The answer to a Content-Length that is not an integer or over the cap (``limit``,
        default the proxy's), else None."""
        try:
            declared = int(length)
        except ValueError:
            return envelope(400, "Content-Length is not an integer", param="content-length")
        if limit is None:
            limit = self.proxy.body_cap()
        if declared > limit:
            return envelope(413, body_too_large(limit, declared))
        return None


def _id_and_length(headers) -> tuple[bytes, bytes | None]:
    """(the request id: the client's first, else a new one; the first Content-Length or
    None) of a request's headers, in one pass."""
    rid = length = None
    for k, v in headers:
        if k == REQUEST_ID:
            if rid is None:
                rid = v
        elif k == b"content-length":
            if length is None:
                length = v
    return request_id(rid), length
