"""Pure-ASGI middleware: request ids, metrics, request body cap."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine_advisor.service.errors import envelope
from engine_advisor.service.metrics import Metrics

SAFE_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
REQUEST_ID = b"x-request-id"


class _Ids:
    """New request ids: 32 hex digits, a random per-process prefix (drawn again in a forked
    child) and a counter. Unique, not secret (a client may send its own), and no system
    call per request as ``os.urandom`` or ``uuid4`` make."""

    def __init__(self) -> None:
        self.seed()
        os.register_at_fork(after_in_child=self.seed)

    def seed(self) -> None:
        self.prefix = os.urandom(8).hex().encode()
        self.n = int.from_bytes(os.urandom(4))

    def new(self) -> bytes:
        self.n = n = (self.n + 1) & 0xFFFF_FFFF_FFFF_FFFF
        return b"%b%016x" % (self.prefix, n)


_ids = _Ids()


def request_id(given: bytes | None) -> bytes:
    """A safe incoming request id as it is, else a new one."""
    if given is not None and SAFE_ID.fullmatch(given):
        return given
    return _ids.new()


def body_too_large(limit: int, size: int, streamed: bool = False) -> str:
    got = f"more than {limit:,} bytes arrived" if streamed else f"{size:,} bytes declared"
    return f"request body too large: {got}; the limit is {limit:,} bytes"


class RequestIdMiddleware:
    """Echo a safe incoming ``X-Request-Id`` or create one; anything else is replaced, so a
    client can never put its own bytes (CR/LF, other headers) into the response."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        for k, v in scope["headers"]:
            if k == REQUEST_ID:
                rid = v
                break
        rid = request_id(rid)
        scope.setdefault("state", {})["request_id"] = rid.decode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != REQUEST_ID]
                message["headers"] = [*headers, (REQUEST_ID, rid)]
            await send(message)

        await self.app(scope, receive, send_with_id)


class MetricsMiddleware:
    """Count and time requests by route template (``/v1/recommend``), never by raw path."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.observe(scope["method"], template, status, time.perf_counter() - start)


class BodyLimitMiddleware:
    """Refuse bodies over ``limit`` bytes with 413: at once when Content-Length says so, and
    while streaming otherwise (chunked bodies, or a Content-Length that lies)."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope["headers"]:
            if k == b"content-length":
                try:
                    declared = int(v)
                except ValueError:
                    await envelope(400, "Content-Length is not an integer",
                                   param="content-length")(scope, receive, send)
                    return
                if declared > self.limit:
                    await envelope(413, self._message(declared))(scope, receive, send)
                    return
                break
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise HTTPException(413, self._message(seen, streamed=True))
            return message

        await self.app(scope, counted, send)

    def _message(self, size: int, streamed: bool = False) -> str:
        return body_too_large(self.limit, size, streamed)


class ProxyBodyLimitMiddleware:
    """The proxy's body cap on ``paths`` (``cap()``: ``ProxyState.body_cap``, the
    ``proxy_max_body_bytes`` setting, else enough for the longest context the pools serve), the
    global one (``limit``) elsewhere. A proxied prompt of a long-context model is far larger than
    /v1/recommend's 1 MiB. (The proxy's entrance, engine_advisor.service.proxy.entrance, checks the
    same itself on its paths.)"""

    def __init__(self, app: ASGIApp, limit: int, cap: Callable[[], int], paths: frozenset[str]):
        self.default = BodyLimitMiddleware(app, limit)
        self.capped = BodyLimitMiddleware(app, limit)
        self.cap, self.paths = cap, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths:
            self.capped.limit = self.cap()
            await self.capped(scope, receive, send)
        else:
            await self.default(scope, receive, send)
