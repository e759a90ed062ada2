"""A strict HTTP/1.1 client for the forwarding hot path: keep-alive connections per upstream.

Why not httpx here: an ``httpx.AsyncClient`` request costs several times the CPU of this client
(httpcore's pool scans every connection on every request; the benchmarks page has the
figures). This client
sends pre-encoded requests on pooled connections and hands back the status, the headers and
the body as it arrives. Health checks and /tokenize still use httpx.

Responses are parsed by httptools (llhttp, the parser of Node.js and uvicorn) inside the
connection's protocol object, as bytes arrive. Refused, with ``ProtocolError`` and the
connection closed: anything llhttp rejects (invalid status line, malformed header lines,
invalid, signed or duplicate Content-Length, invalid chunk-size syntax), Transfer-Encoding other
than exactly ``chunked``, Transfer-Encoding together with Content-Length, a status outside
100..599, an unasked-for ``101``, a second response after a complete one (see
``Response.read``), and anything over ``Limits`` (``LimitError``): the header section, a
non-streaming body (checked against Content-Length before any body byte is read), trailers
and chunk framing. Interim ``1xx`` responses are skipped (at most ``Limits.interim``).

A connection is reused only after a complete response with keep-alive and nothing after it;
bytes arriving on an idle connection retire it. Failures raise this module's exception types
(``UpstreamError`` and subclasses); cancellation at any point closes the connection of the
request and frees its slot, also for a waiter cancelled just as a connection was handed to it.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

IDLE_S = 4.0                    # below uvicorn's 5 s keep-alive: never reuse a closing socket
HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host"}
READ_HIGH = 1 << 18               # buffered bytes of a stream that pause reading upstream
FRAMING_PER_CHUNK = 32          # chunk-size line and CRLFs allowed per chunk (no extensions)


class UpstreamError(Exception):
    """Any failure of a request to an upstream."""


class ConnectError(UpstreamError):
    """The TCP (or TLS) connection could not be made."""


class ConnectTimeout(UpstreamError):
    """No connection within the connect timeout."""


class PoolTimeout(UpstreamError):
    """Every connection slot stayed busy for the connect timeout."""


class ReadError(UpstreamError):
    """The connection failed or closed before the response was complete."""


class ProtocolError(UpstreamError):
    """A response this client refuses (malformed, ambiguous or unasked-for)."""


class LimitError(ProtocolError):
    """A response over one of the configured ``Limits``."""


@dataclass(frozen=True)
class Limits:
    header_bytes: int = 64 << 10      # status line and header fields, interim responses included
    body_bytes: int = 64 << 20        # a whole (non-streaming) body
    trailer_bytes: int = 16 << 10     # trailer fields after the last chunk
    interim: int = 8                  # 1xx responses skipped before the final one


IDLE, HEAD, BODY, DONE = range(4)


class _Extra(Exception):
    """A second response began after the complete one (raised inside the parser)."""


def _framing(lengths: list[bytes], codings: list[bytes]) -> tuple[int | None, bool]:
    """(Content-Length or None, chunked) of a response head's framing fields."""
    if len(lengths) > 1:
        raise ProtocolError("more than one Content-Length")
    if codings and lengths:
        raise ProtocolError("both Transfer-Encoding and Content-Length")
    if codings and (len(codings) > 1 or codings[0].strip().lower() != b"chunked"):
        raise ProtocolError(f"unsupported Transfer-Encoding {b', '.join(codings)[:80]!r}")
    length = None
    if lengths:
        v = lengths[0].strip()
        if not v.isdigit() or len(v) > 18:
            raise ProtocolError(f"invalid Content-Length {v[:40]!r}")
        length = int(v)
    return length, bool(codings)


class Connection(asyncio.Protocol):
    """One upstream connection: llhttp fed from ``data_received``; one request at a time."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.phase = IDLE
        self.error: UpstreamError | None = None   # the response failed; never reused
        self.lost = False
        self.extra = False        # bytes after a complete response (or while idle)
        self.reused = False
        self.idle_since = 0.0
        self.waiter: asyncio.Future | None = None
        self.paused = False
        self._reset(None)

    def _reset(self, cap: int | None) -> None:
        self.cap = cap            # body limit of this response (None: streaming)
        self.got = 0              # bytes received for this request
        self.raw_head = 0         # bytes received while the head was incomplete
        self.head_size = 0        # status line and header fields of interim responses
        self.trailer_size = 0
        self.interim = 0
        self.status = 0
        self.fields: list[tuple[bytes, bytes]] = []   # the head's fields, as received
        self.headers: list[tuple[bytes, bytes]] = []  # the final head's, names lower-case
        self.body: list[bytes] = []
        self.buffered = 0
        self.total = 0            # body bytes of the response
        self.chunks = 0
        self.keep = False
        self.until_close = False
        self.http11 = False       # the answer's first bytes are an HTTP/1.1 status line

    # ---------------------------------------------------------------- transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport          # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        phase = self.phase
        if phase == IDLE or phase == DONE:   # nothing asked: never parsed, never used
            self.extra = True
            if phase == IDLE:
                self.close()
            return
        if phase == HEAD:
            if self.got == 0:                 # the first bytes of the answer
                self.http11 = data.startswith(b"HTTP/1.1 ")
            self.raw_head += len(data)
        self.got += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ProtocolError("the upstream switched protocols"))
        except httptools.HttpParserError as exc:
            cause = exc.__context__           # what a callback of ours raised, if one did
            if isinstance(cause, UpstreamError):
                self._fail(cause)
            elif self.phase == DONE:          # anything after the complete response
                self.extra = True
            else:
                self._fail(ProtocolError(f"malformed response ({exc})"))
        else:
            lim = self.limits
            if self.phase == HEAD:
                if self.raw_head > lim.header_bytes:
                    self._fail(LimitError(f"response header section over {lim.header_bytes} "
                                          "bytes"))
            elif self.got - self.total - self.raw_head > (
                    lim.trailer_bytes + FRAMING_PER_CHUNK * self.chunks):
                self._fail(LimitError(f"chunk framing or trailers over {lim.trailer_bytes} "
                                      "bytes"))
        w = self.waiter                   # _wake()
        if w is not None and not w.done():
            w.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.phase == BODY and self.until_close and self.error is None:
            self.phase, self.keep = DONE, False       # the body ends with the connection
        elif self.phase in (HEAD, BODY) and self.error is None:
            what = "before the response head" if self.phase == HEAD else "mid-body"
            self.error = ReadError(f"connection closed {what}" + (f" ({exc})" if exc else ""))
        self._wake()

    def pause_writing(self) -> None:       # request bodies are in memory already
        pass

    def resume_writing(self) -> None:
        pass

    # ---------------------------------------------------------------- parser callbacks
    def on_message_begin(self) -> None:
        if self.phase == DONE:
            raise _Extra()

    def on_status(self, status: bytes) -> None:
        self.head_size += len(status) + 15

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.phase == HEAD:        # looked at when the head is complete
            self.fields.append((name, value))
            return
        self.trailer_size += len(name) + len(value) + 4     # trailers: counted, dropped
        if self.trailer_size > self.limits.trailer_bytes:
            raise LimitError(f"trailers over {self.limits.trailer_bytes} bytes")

    def on_headers_complete(self) -> None:
        lim = self.limits
        parser = self.parser
        status = parser.get_status_code()
        size = self.head_size
        headers = []
        lengths: list[bytes] = []         # Content-Length values
        codings: list[bytes] = []         # Transfer-Encoding values
        for name, value in self.fields:
            size += len(name) + len(value) + 4
            name = name.lower()
            if name == b"content-length":
                lengths.append(value)
            elif name == b"transfer-encoding":
                codings.append(value)
            headers.append((name, value))
        self.fields = []
        self.head_size = size
        if size > lim.header_bytes:
            raise LimitError(f"response header section over {lim.header_bytes} bytes")
        if not 100 <= status <= 599:
            raise ProtocolError(f"invalid status {status}")
        if not (self.http11 and self.interim == 0):    # else this head is that status line's
            version = parser.get_http_version()          # (a str.format: ~2k instructions)
            if version != "1.1" and version != "1.0":
                raise ProtocolError(f"HTTP version {version}")
        if status < 200:
            if status == 101:
                raise ProtocolError("101 Switching Protocols, not asked for")
            self.interim += 1
            if self.interim > lim.interim:
                raise ProtocolError(f"more than {lim.interim} interim (1xx) responses")
            return
        self.headers = headers
        if not codings and len(lengths) == 1 and lengths[0].isdigit() and len(lengths[0]) < 19:
            length, chunked = int(lengths[0]), False      # the usual framing: nothing to check
        else:
            length, chunked = _framing(lengths, codings)
        if self.cap is not None and length is not None and length > self.cap:
            raise LimitError(f"Content-Length {length} over the body limit of {self.cap} bytes")
        self.status = status
        self.until_close = length is None and not chunked and status not in (204, 304)
        self.phase = BODY

    def on_body(self, body: bytes) -> None:
        self.total += len(body)
        if self.cap is not None and self.total > self.cap:
            raise LimitError(f"body over the limit of {self.cap} bytes")
        self.body.append(body)
        self.buffered += len(body)
        # a stream read slowly pauses the upstream; a whole body is bounded by its cap instead
        if self.cap is None and self.buffered > READ_HIGH and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def on_chunk_header(self) -> None:
        self.chunks += 1

    def on_message_complete(self) -> None:
        if self.phase == HEAD:             # an interim response ended: the final one follows
            return
        self.keep = self.parser.should_keep_alive()
        self.phase = DONE

    # ---------------------------------------------------------------- the request's side
    def _fail(self, exc: UpstreamError) -> None:
        if self.error is None:
            self.error = exc
        self.close()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def wait(self) -> asyncio.Future:
        """A future the next bytes or the connection's end complete: ``await conn.wait()``
        (no coroutine of its own; a future left behind done or cancelled is never woken)."""
        loop = self.loop
        if loop is None:                    # looked up once per connection
            loop = self.loop = asyncio.get_running_loop()
        self.waiter = w = loop.create_future()
        return w

    def take(self) -> bytes:
        """The body bytes buffered so far, in one piece."""
        out = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        self.buffered = 0
        if self.paused and not self.lost:
            self.paused = False
            self.transport.resume_reading()
        return out

    def send(self, data: bytes, cap: int | None) -> None:
        self._reset(cap)
        self.phase = HEAD
        self.transport.write(data)

    def usable(self, now: float) -> bool:
        return (self.phase == IDLE and not self.lost and not self.extra and self.error is None
                and now - self.idle_since < IDLE_S)

    def reusable(self) -> bool:
        return self.phase == DONE and self.keep and not self.lost and not self.extra \
            and self.error is None and not self.body

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()


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
                c.paused = False
                c.transport.resume_reading()
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
    request, and connects under way. A slot is freed by closing its connection; it passes to
    the oldest waiter (who opens a connection in it) or is given up.
    """

    def __init__(self, url: str, max_connections: int, limits: Limits | None = None):
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
        self.open = 0
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
        while self.idle:
            c = self.idle.pop()
            if c.usable(now):
                c.reused = True
                return c
            c.close()
            self.open -= 1
        return None

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
              body: bytes, lines: bytes | None) -> bytes:
        if lines is None:
            lines = b"".join([k + b": " + v + b"\r\n" for k, v in headers or () if k not in HOP])
        start = self.starts.get((method, path))
        if start is None:      # the request line and host: once per method and (proxy) path
            start = self.starts[(method, path)] = b"%b %b HTTP/1.1\r\nhost: %b\r\n" % (
                method.encode(), self.prefix + path.encode(), self.host_header)
        return b"".join((start, b"content-length: %d\r\n" % len(body), lines, b"\r\n", body))

    async def _exchange(self, data: bytes, cap: int | None, connect_timeout: float,
                        whole: bool) -> Connection:
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
            self.idle.pop().close()
            self.open -= 1
        for fut in self.waiters:
            if not fut.done():
                fut.set_exception(PoolTimeout("the upstream was removed"))
        self.waiters.clear()
