"""The proxy's front door: ``POST /v1/chat/completions``, ``/v1/completions`` and ``/generate``.

Two adapters over one ``Entrance.handle``:

- ``lane(cycle)``: uvicorn's direct lane under ``engine-advisor serve``
  (engine_advisor.service.transport.protocol): the body is gathered in the protocol's own buffer
  (no copy per read), and whole responses are written as bytes (``LaneWriter``);
- ``asgi(scope, receive, send)``: any other server, through engine_advisor.service.main.App, which
  dispatches these paths here before FastAPI (``AsgiWriter``).

``handle`` does for these paths what the app's middleware does around every other route (a request
id, the request metrics, the body cap: 400 or 413 on Content-Length, 413 while the body streams in),
then the client's API key (engine_advisor.service.proxy.auth), the body's facts and the routing
decision (engine_advisor.service.proxy.decision), and hands the request to its relay
(engine_advisor.service.proxy.relay). Every error before the relay starts becomes the error envelope
(an unexpected exception a logged 500); a client gone before its body arrived gets nothing.
FastAPI's own layers (telemetry checks, server-error and exception middleware, route matching,
dependency solving) and the middleware's wrappers around ``send`` and ``receive`` are a large share
of the proxy's CPU per request (bench/bench_proxy.py) and are skipped. The FastAPI routes of these
paths (engine_advisor.service.routes.proxy) only describe them in the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from engine_advisor.service.deps import model_of
from engine_advisor.service.errors import ApiError, envelope, internal_error
from engine_advisor.service.metrics import Metrics
from engine_advisor.service.middleware import REQUEST_ID, body_too_large, request_id
from engine_advisor.service.proxy.auth import authorization_of, authorize
from engine_advisor.service.proxy.decision import Counting, choose_now
from engine_advisor.service.proxy.generate import GENERATE, choose_generate
from engine_advisor.service.proxy.relay.attempts import Relay
from engine_advisor.service.proxy.relay.writer import AsgiWriter, LaneWriter
from engine_advisor.service.proxy.request import CHAT, COMPLETIONS, parse, read_body
from engine_advisor.service.proxy.state import NO_POOLS
from engine_advisor.service.transport.cycle import OverCap

if TYPE_CHECKING:
    from engine_advisor.service.proxy.state import ProxyState
    from engine_advisor.service.transport.cycle import LaneCycle

PATHS = frozenset({CHAT, COMPLETIONS, GENERATE})


class _Template:
    """What MetricsMiddleware reads from ``scope["route"]``: the route template."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path


TEMPLATES = {p: _Template(p) for p in PATHS}


class Entrance:
    """See the module docstring."""

    def __init__(self, proxy: ProxyState, metrics: Metrics):
        self.proxy, self.metrics = proxy, metrics

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("state", {})
        await self.handle(scope, AsgiWriter(receive, send), partial(_read, receive),
                          receive, asyncio.current_task())

    async def lane(self, cycle: LaneCycle) -> None:
        await self.handle(cycle.scope, LaneWriter(cycle), partial(_gather, cycle),
                          cycle.receive, cycle.task)

    async def handle(self, scope: Scope, writer: LaneWriter | AsgiWriter,
                     body_of: Callable[[int, int], Awaitable[bytes | bytearray]],
                     receive: Receive, task: asyncio.Task) -> None:
        """One request: ``body_of(cap, declared)`` reads its whole body (413 over ``cap``
        bytes; ``declared``: its Content-Length, 0 when it has none); the relay runs in
        ``task``."""
        start = time.perf_counter()
        path = scope["path"]
        scope["route"] = TEMPLATES[path]
        headers = scope["headers"]
        rid, length = _id_and_length(headers)
        scope["state"]["request_id"] = rid.decode()
        status = 500
        try:
            try:
                relay = await self._relay(scope, rid, length, body_of)
            except ApiError as exc:
                response = exc.response()
            except HTTPException as exc:
                response = envelope(exc.status_code, str(exc.detail), headers=exc.headers)
            except ClientDisconnect:      # gone before its body arrived: nobody to answer
                return
            except Exception:
                response = internal_error(scope["method"], path)
            else:
                try:
                    await relay.run(writer, task)
                finally:
                    status = relay.status_code
                return
            status = response.status_code
            response.headers[REQUEST_ID.decode()] = rid.decode()
            await response(scope, receive, writer.send)
        finally:
            self.metrics.observe("POST", path, status, time.perf_counter() - start)

    async def _relay(self, scope: Scope, rid: bytes, length: bytes | None,
                     body_of: Callable[[int, int], Awaitable[bytes | bytearray]]) -> Relay:
        st = self.proxy
        path, headers = scope["path"], scope["headers"]
        cap = st.body_cap()
        if length is not None and not (length.isdigit() and int(length) <= cap):
            _check_length(length, cap)
        pools = st.pools
        if pools is None:
            raise ApiError(503, NO_POOLS)
        if pools.api_keys:
            authorize(pools, authorization_of(headers))
        body = await body_of(cap, 0 if length is None else int(length))   # checked above
        loaded = model_of(scope["app"].state)
        if path == GENERATE:
            req, chosen = await choose_generate(st, pools, loaded, body)
        else:
            req = parse(body, path)
            chosen = choose_now(st, pools, loaded, req)
            if type(chosen) is Counting:          # the decision waits for a prompt count
                chosen = await chosen.count()
        return Relay(st, pools, req, chosen.decision, chosen.first, rid, chosen.prompt_tokens,
                     headers)


async def _read(receive: Receive, cap: int, declared: int) -> bytes:
    """The ASGI path's whole body (``read_body``)."""
    return await read_body(receive, cap)


async def _gather(cycle: LaneCycle, cap: int, declared: int) -> bytes | bytearray:
    """The lane's whole body (``LaneCycle.gather_body``)."""
    try:
        body = await cycle.gather_body(cap, declared)
    except OverCap as exc:
        raise ApiError(413, body_too_large(cap, exc.size, streamed=True)) from None
    if body is None:
        raise ClientDisconnect()
    return body


def _check_length(length: bytes, cap: int) -> None:
    """400 for a Content-Length that is not an integer, 413 for one over ``cap``."""
    try:
        declared = int(length)
    except ValueError:
        raise ApiError(400, "Content-Length is not an integer", param="content-length") from None
    if declared > cap:
        raise ApiError(413, body_too_large(cap, declared))


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
