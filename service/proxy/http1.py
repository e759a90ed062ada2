"""A small HTTP/1.1 client for the forwarding hot path: keep-alive connections per upstream.

Why not httpx here: measured on this machine (bench/bench_proxy.py's notes), an
``httpx.AsyncClient`` request costs about 1 ms of CPU at concurrency 1 and 2.4 ms at
concurrency 32 (httpcore's pool scans every connection on every request), four times what the
simulator spends answering it. This client does one thing: send pre-encoded requests on pooled
connections and hand back the status, the headers and the body as it arrives (chunked or
sized), in about a tenth of that. Failures raise httpx's exception types (``ConnectError``,
``ConnectTimeout``, ``PoolTimeout``, ``ReadError``, ``RemoteProtocolError``), so callers map
them the way they map httpx's. Health checks and /tokenize still use httpx.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx

READ_LIMIT = 1 << 20            # longest header block / chunk-size line accepted
IDLE_S = 4.0                    # below uvicorn's 5 s keep-alive: never reuse a closing socket
HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host"}


class Connection:
    __slots__ = ("reader", "writer", "idle_since", "reused")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.idle_since = 0.0
        self.reused = False

    def close(self) -> None:
        self.writer.transport.abort()


SIZED, CHUNKED, UNTIL_CLOSE = 0, 1, 2


class Response:
    """One response; iterate ``body()`` (or ``read()``) once, then ``release()``."""

    __slots__ = ("status", "headers", "_conn", "_pool", "_mode", "_length", "_keep", "_done")

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], conn: Connection,
                 pool: Http1Pool, mode: int, length: int, keep: bool):
        self.status, self.headers = status, headers
        self._conn, self._pool = conn, pool
        self._mode, self._length, self._keep = mode, length, keep
        self._done = mode == SIZED and length == 0

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None

    async def body(self) -> AsyncIterator[bytes]:
        r = self._conn.reader
        try:
            if self._mode == CHUNKED:
                # Every complete chunk that has arrived, in one piece per read: a stream of
                # small events costs one await and one client write per read, not per chunk.
                buf, done, need = b"", False, 0
                while not done:
                    # a large chunk under way: the rest of it in one read (no re-scanning)
                    data = await (r.readexactly(need) if need > 1 << 16 else r.read(1 << 16))
                    if not data:
                        raise asyncio.IncompleteReadError(buf, None)
                    buf = buf + data if buf else data
                    pieces, used, done, need = unchunk(buf)
                    buf = buf[used:]
                    if pieces:
                        yield pieces[0] if len(pieces) == 1 else b"".join(pieces)
                if buf:            # bytes after the last chunk: the connection is not reusable
                    self._keep = False
            elif self._mode == SIZED:
                left = self._length
                while left > 0:
                    data = await r.read(min(left, 1 << 16))
                    if not data:
                        raise httpx.RemoteProtocolError(
                            f"connection closed with {left} body bytes missing")
                    left -= len(data)
                    yield data
            else:                                  # delimited by the connection closing
                while data := await r.read(1 << 16):
                    yield data
        except asyncio.IncompleteReadError as exc:
            raise httpx.RemoteProtocolError(f"connection closed mid-body ({exc})") from None
        except (ValueError, asyncio.LimitOverrunError) as exc:
            raise httpx.RemoteProtocolError(f"malformed chunked body ({exc})") from None
        except OSError as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from None
        self._done = True

    async def read(self) -> bytes:
        if self._mode != SIZED or self._done:
            return b"".join([c async for c in self.body()])
        try:           # the common case in one call, without the generator's overhead
            data = await self._conn.reader.readexactly(self._length)
        except asyncio.IncompleteReadError as exc:
            raise httpx.RemoteProtocolError(
                f"connection closed with {self._length - len(exc.partial)} body bytes "
                "missing") from None
        except OSError as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from None
        self._done = True
        return data

    def release(self) -> None:
        """Give the connection back (reused only after a complete body), exactly once."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._put(conn, self._done and self._keep)


def unchunk(buf: bytes) -> tuple[list[bytes], int, bool, int]:
    """Decode the complete chunks at the start of a chunked body: (their data, bytes used,
    whether the last chunk and its trailers were among them, bytes still missing of the chunk
    under way when its size is known, else 0). ValueError when malformed."""
    pieces: list[bytes] = []
    pos, n = 0, len(buf)
    while True:
        nl = buf.find(b"\r\n", pos)
        if nl < 0:
            if n - pos > READ_LIMIT:
                raise ValueError("chunk-size line too long")
            return pieces, pos, False, 0
        size = int(buf[pos:nl].split(b";", 1)[0], 16)
        if size < 0:
            raise ValueError(f"negative chunk size {size}")
        if size == 0:                      # the last chunk, then trailers and an empty line
            end = buf.find(b"\r\n\r\n", nl)
            if end < 0:
                return pieces, pos, False, 0
            return pieces, end + 4, True, 0
        start = nl + 2
        stop = start + size
        if n < stop + 2:
            return pieces, pos, False, stop + 2 - n
        if buf[stop:stop + 2] != b"\r\n":
            raise ValueError("chunk data not followed by CRLF")
        pieces.append(buf[start:stop])
        pos = stop + 2


def _head(method: str, target: bytes, host: bytes, headers: list[tuple[bytes, bytes]],
          length: int) -> bytes:
    lines = [f"{method} ".encode() + target + b" HTTP/1.1", b"host: " + host,
             b"content-length: " + str(length).encode()]
    lines += [k + b": " + v for k, v in headers if k not in HOP]
    return b"\r\n".join(lines) + b"\r\n\r\n"


class Http1Pool:
    """Keep-alive connections to one ``http://host:port`` (at most ``max_connections``)."""

    def __init__(self, url: str, max_connections: int):
        u = urlsplit(url)
        self.tls = ssl.create_default_context() if u.scheme == "https" else None
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/").encode()
        self.host_header = u.netloc.encode()
        self.max = max_connections
        self.idle: deque[Connection] = deque()
        self.open = 0
        self.waiters: deque[asyncio.Future] = deque()
        self.closed = False

    async def _get(self, connect_timeout: float) -> Connection:
        now = time.monotonic()
        while self.idle:
            c = self.idle.pop()                       # most recently used first
            if now - c.idle_since < IDLE_S and not c.reader.at_eof():
                c.reused = True
                return c
            self.open -= 1
            c.close()
        if self.open >= self.max:
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            try:
                async with asyncio.timeout(connect_timeout):
                    return await fut
            except TimeoutError:
                raise httpx.PoolTimeout(f"all {self.max} connections busy") from None
            finally:
                if fut in self.waiters:
                    self.waiters.remove(fut)
        self.open += 1
        try:
            async with asyncio.timeout(connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, limit=READ_LIMIT, ssl=self.tls,
                    server_hostname=self.host if self.tls else None)
        except TimeoutError:
            self.open -= 1
            raise httpx.ConnectTimeout(f"no connection within {connect_timeout:g} s") from None
        except OSError as exc:
            self.open -= 1
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from None
        except BaseException:
            self.open -= 1
            raise
        return Connection(reader, writer)

    def _put(self, conn: Connection, reusable: bool) -> None:
        if reusable and not self.closed:
            while self.waiters:
                fut = self.waiters.popleft()
                if not fut.done():
                    conn.reused = True
                    fut.set_result(conn)
                    return
            conn.idle_since = time.monotonic()
            self.idle.append(conn)
            return
        self.open -= 1
        conn.close()
        # a slot freed: let a waiter open a connection of its own
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(_Retry())
                return

    async def request(self, method: str, path: str, headers: list[tuple[bytes, bytes]],
                      body: bytes, connect_timeout: float) -> Response:
        """Send and read the response head; the caller reads the body and releases it."""
        target = self.prefix + path.encode()
        data = _head(method, target, self.host_header, headers, len(body)) + body
        stale = 0
        while True:
            try:
                conn = await self._get(connect_timeout)
            except _Retry:          # a connection slot freed up: open one
                continue
            try:
                return await self._exchange(conn, data)
            except _Stale:          # a kept-alive socket the server had closed: new one
                stale += 1
                if stale >= 3:
                    raise httpx.ReadError("the upstream closed three kept-alive connections "
                                          "before answering") from None

    async def _exchange(self, conn: Connection, data: bytes) -> Response:
        ok = False
        try:
            conn.writer.write(data)
            if len(data) > 1 << 16:
                await conn.writer.drain()
            try:
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if conn.reused and not exc.partial:
                    raise _Stale() from None
                raise httpx.RemoteProtocolError("connection closed before the response "
                                                "head") from None
            except asyncio.LimitOverrunError:
                raise httpx.RemoteProtocolError("response head too large") from None
            except (ConnectionResetError, BrokenPipeError):
                if conn.reused:
                    raise _Stale() from None
                raise
            resp = self._parse(head, conn)
            ok = True
            return resp
        except OSError as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from None
        finally:
            if not ok:
                self.open -= 1
                conn.close()

    def _parse(self, head: bytes, conn: Connection) -> Response:
        lines = head[:-4].split(b"\r\n")
        try:
            version, code, *_ = lines[0].split(b" ", 2)
            status = int(code)
        except ValueError:
            raise httpx.RemoteProtocolError(f"bad status line {lines[0][:80]!r}") from None
        headers = []
        length, chunked, close = None, False, version == b"HTTP/1.0"
        try:
            for line in lines[1:]:
                k, _, v = line.partition(b":")
                k, v = k.strip().lower(), v.strip()
                if k == b"content-length":
                    length = int(v)
                elif k == b"transfer-encoding":
                    chunked = b"chunked" in v.lower()
                elif k == b"connection":
                    close = close or v.lower() == b"close"
                else:
                    headers.append((k, v))
        except ValueError:
            raise httpx.RemoteProtocolError("bad Content-Length") from None
        if status in (204, 304) or 100 <= status < 200:
            mode, length = SIZED, 0
        elif chunked:
            mode = CHUNKED
        elif length is not None:
            mode = SIZED
        else:
            mode, close = UNTIL_CLOSE, True
        return Response(status, headers, conn, self, mode, length or 0, not close)

    async def aclose(self) -> None:
        self.closed = True
        while self.idle:
            self.idle.pop().close()
        for fut in self.waiters:
            if not fut.done():
                fut.set_exception(httpx.PoolTimeout("the upstream was removed"))
        self.waiters.clear()


class _Stale(Exception):
    pass


class _Retry(Exception):
    pass
