"""One upstream HTTP/1.1 connection: the response parsed by llhttp as its bytes arrive.

``Connection`` is the asyncio protocol of one pooled connection
(engine_advisor.service.transport.client): it feeds httptools (llhttp, the parser of Node.js and
uvicorn) from ``data_received`` and keeps one response's state. Refused, with ``ProtocolError`` and
the connection closed: anything llhttp rejects (invalid status line, malformed header lines,
invalid, signed or duplicate Content-Length, invalid chunk-size syntax), Transfer-Encoding other
than exactly ``chunked``, Transfer-Encoding together with Content-Length, a status outside 100..599,
an unasked-for ``101``, and anything over ``Limits`` (``LimitError``): the header section, a
non-streaming body (checked against Content-Length before any body byte is read), trailers and chunk
framing. Interim ``1xx`` responses are skipped (at most ``Limits.interim``). Bytes after a complete
response (or on an idle connection) mark it ``extra``: it is never reused.

``last_in`` is when the connection last received bytes (or was resumed after a pause): the
pool's reaper (engine_advisor.service.transport.reaper) ends a response that stalls on it.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass

import httptools

READ_HIGH = 1 << 18               # buffered bytes of a stream that pause reading upstream
FRAMING_PER_CHUNK = 32          # chunk-size line and CRLFs allowed per chunk (no extensions)
_now = time.monotonic


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


class IdleTimeout(UpstreamError):
    """A response under way received no byte for the pool's ``idle_s``."""


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
        self.idle_since = 0.0     # when it was last given back to the pool
        self.last_in = 0.0        # when bytes last arrived (or reading resumed)
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
        self.last_in = _now()
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
            self.resume()
        return out

    def resume(self) -> None:
        """Read again after ``on_body`` paused a slow stream (the pause is not idleness)."""
        self.paused = False
        self.last_in = _now()
        self.transport.resume_reading()

    def send(self, data: bytes | tuple[bytes, bytes], cap: int | None) -> None:
        """``data``: the request in one buffer, or its head and a long body apart."""
        self._reset(cap)
        self.phase = HEAD
        if type(data) is tuple:
            self.transport.writelines(data)
        else:
            self.transport.write(data)

    def usable(self, now: float, keepalive_s: float) -> bool:
        return (self.phase == IDLE and not self.lost and not self.extra and self.error is None
                and now - self.idle_since < keepalive_s)

    def stalled(self, now: float, idle_s: float) -> bool:
        """A response has begun (its first bytes are in) and no byte came for ``idle_s``; a
        stream paused because its reader is slow is not stalled."""
        return ((self.phase == BODY or (self.phase == HEAD and self.got))
                and not self.paused and self.error is None and now - self.last_in >= idle_s)

    def expire(self, exc: UpstreamError) -> None:
        """End the response under way with ``exc`` (the connection closed, its reader woken)."""
        self._fail(exc)
        self._wake()

    def reusable(self) -> bool:
        return self.phase == DONE and self.keep and not self.lost and not self.extra \
            and self.error is None and not self.body

    def close(self) -> None:
        if self.transport is not None:
            self.transport.abort()
