"""A strict HTTP/1.1 client for the forwarding hot path: keep-alive connections per upstream.

Why not httpx here: an ``httpx.AsyncClient`` request costs several times the CPU of this client
(httpcore's pool scans every connection on every request; the benchmarks page has the
figures). This client sends pre-encoded requests on pooled connections and hands back the
status, the headers and the body as it arrives. Health checks and /tokenize still use httpx.

Three parts: ``Http1Pool`` and ``Response`` here (the slots, the exchange, a response's body);
engine_advisor.service.transport.connection (one connection, its response parsed by httptools as
bytes arrive, and what it refuses); engine_advisor.service.transport.reaper (the pool's timer: idle
connections closed after ``keepalive_s``, a response that stalls for ``idle_s`` ended).

A connection is reused only after a complete response with keep-alive and nothing after it; bytes
arriving on an idle connection retire it, and the reaper closes it within a tick. A second response
after a complete one is refused (see ``Response.read``). Failures raise the exception types of
engine_advisor.service.transport.connection (``UpstreamError`` and subclasses, re-exported here);
cancellation at any point closes the connection of the request and frees its slot, also for a waiter
cancelled just as a connection was handed to it.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

from engine_advisor.service.transport.connection import (
    BODY,
    DONE,
    HEAD,
    IDLE,
    ConnectError,
    Connection,
    ConnectTimeout,
    IdleTimeout,
    LimitError,
    Limits,
    PoolTimeout,
    ProtocolError,
    ReadError,
    UpstreamError,
)
from engine_advisor.service.transport.reaper import Reaper

__all__ = ["BODY", "DONE", "HEAD", "IDLE", "ConnectError", "ConnectTimeout", "Connection",
           "Http1Pool", "IdleTimeout", "LimitError", "Limits", "PoolTimeout", "ProtocolError",
           "ReadError", "Response", "UpstreamError"]

KEEPALIVE_S = 4.0               # below uvicorn's 5 s keep-alive: never reuse a closing socket
HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host"}
# a request body this long is written after its head, not copied into one buffer with it
APART_BYTES = 64 * 1024


class Response:
    """One response; read it with ``read()`` or ``body()`` once, then ``release()``."""

    __slots__ = ("status", "headers", "_conn", "_pool")

    def __init__(self, conn: Connection, pool: Http1Pool):
        self.status, self.headers = conn.status, conn.headers
        self._conn: Connection | None = conn
        self._pool = pool

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    async def body(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked framing removed), each piece all that arrived."""
        c = self._conn
        while True:
            if c.body:
                yield c.take()
            elif c.error is not None:
                raise c.error
            elif c.phase == DONE:
                return
            else:
                await c.wait()

    async def read(self) -> bytes:
        """The whole body (within ``Limits.body_bytes``). A second response already received
        after it is refused: which of the two answers this request cannot be told."""
        c = self._conn
        if c.cap is None:                  # asked as a stream, read whole after all
            c.cap = self._pool.limits.body_bytes
            if c.total > c.cap:
                raise LimitError(f"body over the limit of {c.cap} bytes")
            if c.paused and not c.lost:
                c.resume()
        while c.phase != DONE:
            if c.error is not None:
                raise c.error
            await c.wait()
        if c.error is not None:
            raise c.error
        if c.extra:
            raise ProtocolError("bytes after a complete response")
        return c.take()

    def release(self) -> None:
        """Give the connection back (reused only after a clean, complete response), once."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.put(conn)


class Http1Pool:
    """Keep-alive connections to one ``http(s)://host:port`` (at most ``max_connections``).

    ``open`` counts connection slots in use: idle connections, connections serving a
    request, and connects under way; ``conns`` holds the connections made (idle or serving).
    A slot is freed by closing its connection; it passes to the oldest waiter (who opens a
    connection in it) or is given up.

    ``keepalive_s``: an idle connection older than this is closed (by the reaper, used or
    not); ``idle_s``: a response under way that receives no byte for this long fails with
    ``IdleTimeout`` (None: never). Both may be changed while the pool runs.
    """

    def __init__(self, url: str, max_connections: int, limits: Limits | None = None, *,
                 keepalive_s: float = KEEPALIVE_S, idle_s: float | None = None):
        u = urlsplit(url)
        self.tls = ssl.create_default_context() if u.scheme == "https" else None
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/").encode()
        self.host_header = u.netloc.encode()
        self.starts: dict[tuple[str, str], bytes] = {}
        self.max = max_connections
        self.limits = limits or Limits()
        self.idle: deque[Connection] = deque()
        self.conns: set[Connection] = set()
        self.open = 0
        self.keepalive_s = keepalive_s
        self.idle_s = idle_s
        self.reaper = Reaper(self)
        self.waiters: deque[asyncio.Future] = deque()
        self.closed = False

    # ---------------------------------------------------------------- slots
    def _free_slot(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)          # the slot passes on: open a connection in it
                return
        self.open -= 1

    def put(self, conn: Connection) -> None:
        """A connection back from a request: reused if clean, else closed (slot freed)."""
        if conn.reusable() and not self.closed:
            conn.phase = IDLE
            while self.waiters:
                fut = self.waiters.popleft()
                if not fut.done():
                    fut.set_result(conn)
                    return
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
            return
        conn.close()
        self.conns.discard(conn)
        self._free_slot()

    def _hand_back(self, got: Connection | None) -> None:
        if got is None:
            self._free_slot()
        else:
            self.put(got)

    def _idle(self) -> Connection | None:
        """A usable idle connection (the most recently used first), or None; unusable ones
        are closed on the way."""
        now = time.monotonic()
        keepalive_s = self.keepalive_s
        while self.idle:
            c = self.idle.pop()
            if c.usable(now, keepalive_s):
                c.reused = True
                return c
            self.retire(c)
        return None

    def retire(self, c: Connection) -> None:
        """Close a connection taken out of ``idle`` (its slot given up)."""
        c.close()
        self.conns.discard(c)
        self.open -= 1

    async def _get(self, connect_timeout: float) -> Connection:
        c = self._idle()
        if c is not None:
            return c
        if self.closed:
            raise PoolTimeout("the upstream was removed")
        if self.open >= self.max:
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            try:
                async with asyncio.timeout(connect_timeout):
                    got = await fut
            except BaseException as exc:
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    self._hand_back(fut.result())     # handed over as we gave up: pass it on
                elif fut in self.waiters:
                    self.waiters.remove(fut)
                if isinstance(exc, TimeoutError):
                    raise PoolTimeout(f"all {self.max} connections busy") from None
                raise
            if got is not None:
                got.reused = True
                return got
        else:
            self.open += 1
        return await self._connect(connect_timeout)   # in the slot counted above

    async def _connect(self, connect_timeout: float) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(self.limits), self.host, self.port, ssl=self.tls,
                    server_hostname=self.host if self.tls else None)
        except TimeoutError:
            self._free_slot()
            raise ConnectTimeout(f"no connection within {connect_timeout:g} s") from None
        except OSError as exc:
            self._free_slot()
            raise ConnectError(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            self._free_slot()
            raise
        self.conns.add(conn)
        self.reaper.start(loop)
        return conn

    # ---------------------------------------------------------------- requests
    async def request(self, method: str, path: str, headers: list[tuple[bytes, bytes]] | None,
                      body: bytes, connect_timeout: float, *,
                      whole: bool = True, lines: bytes | None = None) -> Response:
        """Send and wait for the response head; the caller reads the body and releases it.
        ``whole``: the body will be read whole (``Limits.body_bytes`` applies). ``lines``:
        the headers already as ``name: value\r\n`` lines (none of ``HOP``), instead of
        ``headers``."""
        conn = await self._exchange(self._data(method, path, headers, body, lines),
                                    self.limits.body_bytes if whole else None,
                                    connect_timeout, False)
        return Response(conn, self)

    async def whole(self, method: str, path: str, body: bytes, connect_timeout: float,
                    lines: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """``request`` and ``Response.read`` in one, for a caller that waits for the whole
        response anyway: (status, headers, body), the connection already given back."""
        conn = await self._exchange(self._data(method, path, None, body, lines),
                                    self.limits.body_bytes, connect_timeout, True)
        try:
            if conn.extra:
                raise ProtocolError("bytes after a complete response")
            return conn.status, conn.headers, conn.take()
        finally:
            self.put(conn)

    def _data(self, method: str, path: str, headers: list[tuple[bytes, bytes]] | None,
              body: bytes, lines: bytes | None) -> bytes | tuple[bytes, bytes]:
        """The request's bytes: one buffer, or (head, body) for a body of ``APART_BYTES``
        or more, written after its head rather than copied into one buffer with it."""
        if lines is None:
            lines = b"".join([k + b": " + v + b"\r\n" for k, v in headers or () if k not in HOP])
        start = self.starts.get((method, path))
        if start is None:      # the request line and host: once per method and (proxy) path
            start = self.starts[(method, path)] = b"%b %b HTTP/1.1\r\nhost: %b\r\n" % (
                method.encode(), self.prefix + path.encode(), self.host_header)
        if len(body) >= APART_BYTES:
            return b"".join((start, b"content-length: %d\r\n" % len(body), lines, b"\r\n")), body
        return b"".join((start, b"content-length: %d\r\n" % len(body), lines, b"\r\n", body))

    async def _exchange(self, data: bytes | tuple[bytes, bytes], cap: int | None,
                        connect_timeout: float, whole: bool) -> Connection:
        """``data`` sent on a pooled connection, which is returned once the response head
        (``whole``: the whole response) has arrived. A kept-alive connection the upstream
        closed before answering is replaced, twice at most."""
        stale = 0
        while True:
            conn = self._idle() if self.idle else None   # no coroutine when one is idle
            if conn is None:
                conn = await self._get(connect_timeout)
            try:
                conn.send(data, cap)
                if whole:
                    while conn.phase != DONE and conn.error is None:
                        await conn.wait()
                else:
                    while conn.phase == HEAD and conn.error is None:
                        await conn.wait()
                if conn.error is not None:
                    # a kept-alive socket the server closed before answering: a new one
                    if conn.reused and conn.got == 0 and isinstance(conn.error, ReadError):
                        stale += 1
                        if stale < 3:
                            self.put(conn)
                            continue
                        raise ReadError("the upstream closed three kept-alive connections "
                                        "before answering")
                    raise conn.error
            except BaseException:
                self.put(conn)          # not reusable mid-request: closed, slot freed
                raise
            return conn

    async def aclose(self) -> None:
        self.closed = True
        while self.idle:
            self.retire(self.idle.pop())
        if not self.conns:
            self.reaper.stop()
        for fut in self.waiters:
            if not fut.done():
                fut.set_exception(PoolTimeout("the upstream was removed"))
        self.waiters.clear()
