"""One request of uvicorn's connection on the direct lane
(engine_advisor.service.transport.protocol).

``LaneCycle`` gives uvicorn's protocol the attributes it uses on a cycle (``body``, ``more_body``,
``message_event``, ``response_complete``, ``disconnected``, ``keep_alive``, ``run_asgi``), so the
protocol's own body, disconnect, pipelining and shutdown handling apply to it unchanged; its ASGI
``receive``/``send`` need no ``asyncio.Event`` and frame and check the response here. The head is
held until the response's first body message and both leave in one write (or at the end of the
event-loop iteration). The proxy's entrance (engine_advisor.service.proxy.entrance) works on the
cycle itself: ``gather_body`` (the whole body, joined once), ``respond`` (a whole
response in one write, header lines checked by the caller), ``task`` (the request's task) and
``on_disconnect`` (called from ``connection_lost``). No object of a request refers back to the
cycle, so each request is freed by reference counting, not left to the cyclic garbage
collector.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable
from typing import Any

from engine_advisor.service.transport.headers import (
    BAD_VALUE,
    GOOD_NAMES,
    NO_BODY,
    STATUS_LINES,
    check_name,
    check_value,
    default_lines,
    status_line,
)

log = logging.getLogger("uvicorn.error")


class _Wakeup:
    """The cycle's ``message_event``: what uvicorn's protocol sets when body bytes arrive,
    the body ends or the client disconnects. An ``asyncio.Event`` without its per-wait
    running-loop lookup (a ``getpid`` system call each)."""

    __slots__ = ("loop", "flag", "waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.flag = False
        self.waiters: list[asyncio.Future] = []

    def set(self) -> None:
        self.flag = True
        if self.waiters:
            for w in self.waiters:
                if not w.done():
                    w.set_result(None)

    def clear(self) -> None:
        self.flag = False

    async def wait(self) -> None:
        if self.flag:
            return
        w = self.loop.create_future()
        self.waiters.append(w)
        try:
            await w
        finally:
            self.waiters.remove(w)


# a declared body length from which the body is copied into one buffer (``Chunks.expect``):
# above what one read of the socket gives, so that a short body stays its one chunk, uncopied
PRESIZED = 1 << 20


def _bytearray_of_size() -> Callable[[int], bytearray]:
    """``bytearray(n)`` writes n zeros, which makes all its pages resident at once; CPython's
    ``PyByteArray_FromStringAndSize(NULL, n)`` leaves the bytes unwritten, so that a body's
    buffer takes memory as its bytes arrive (a client that declares 32 MiB and sends 8 holds
    about 8), not when it is allocated. Every byte of it is written before it is read
    (``Chunks.whole`` cuts what never came)."""
    try:
        new = ctypes.pythonapi.PyByteArray_FromStringAndSize
    except AttributeError:                 # not CPython
        return bytearray
    new.restype = ctypes.py_object
    new.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
    return lambda n: new(None, n)


_unfilled = _bytearray_of_size()


class Chunks:
    """A request body as it arrives: uvicorn's ``cycle.body += data`` keeps each chunk the
    parser hands over (no copy), and the body is joined once, when it is read. A ``bytearray``
    grown chunk by chunk was copied again at many of its regrowths: with 64 bodies of 4 MB in
    flight none can grow in place, and that append was a third of the proxy's CPU
    (docs/benchmarks.md, long prompts).

    A long body whose length is declared (``expect``) is instead copied, chunk by chunk, into
    one buffer of that length, allocated once a quarter of it has arrived and left unwritten
    until its bytes come (``_unfilled``: the memory it takes is what arrived). Each byte is
    still copied once, but the chunks are freed as they come instead of living
    beside the joined body: with 64 bodies of 4 MB in flight the proxy's peak resident memory
    fell by 40-55 MB, as the allocator reuses the bodies' same-sized buffers (docs/proxy.md)."""

    __slots__ = ("parts", "size", "expected", "buf")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.expected = 0            # the declared length of a long body (``expect``)
        self.buf: bytearray | None = None

    def expect(self, length: int) -> None:
        """The body's declared length, at least ``PRESIZED`` bytes: copy it into one buffer."""
        if self.buf is None:
            self.expected = length
            if self.size * 4 >= length:
                self._presize()

    def _presize(self) -> None:
        buf = self.buf = _unfilled(max(self.expected, self.size))
        at = 0
        for part in self.parts:
            buf[at:at + len(part)] = part
            at += len(part)
        self.parts = []

    def __iadd__(self, data: bytes) -> Chunks:
        if data:
            buf = self.buf
            if buf is not None:
                at, end = self.size, self.size + len(data)
                if end <= len(buf):
                    buf[at:end] = data
                else:                    # more than declared (the parser allows no such body)
                    del buf[at:]
                    buf += data
            else:
                self.parts.append(data)
            self.size += len(data)
            if self.expected and buf is None and self.size * 4 >= self.expected:
                self._presize()
        return self

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        if self.buf is not None:
            return bytes(memoryview(self.buf)[:self.size])
        parts = self.parts
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def whole(self) -> bytes | bytearray:
        """The whole body: the buffer of a presized one (no copy), else the chunks joined."""
        buf = self.buf
        if buf is None:
            return bytes(self)
        if len(buf) != self.size:        # fewer bytes than declared
            del buf[self.size:]
        return buf

    def clear(self) -> None:
        self.parts = []
        self.size = 0
        self.expected = 0
        self.buf = None


class OverCap(Exception):
    """A request body over the caller's cap: ``size`` bytes had arrived."""

    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


class LaneCycle:
    """One request of the direct lane: ASGI ``receive`` and ``send`` over the connection."""

    __slots__ = ("scope", "transport", "flow", "loop", "default_headers", "keep_alive",
                 "on_response", "body", "more_body", "disconnected", "on_disconnect",
                 "message_event", "body_read", "response_started", "response_complete",
                 "chunked", "left", "head", "flush_at", "task")

    def __init__(self, scope: dict, transport: asyncio.Transport, flow: Any,
                 loop: asyncio.AbstractEventLoop, default_headers: list[tuple[bytes, bytes]],
                 keep_alive: bool, on_response: Callable[[], None]):
        self.scope, self.transport, self.flow, self.loop = scope, transport, flow, loop
        self.default_headers = default_headers
        self.keep_alive = keep_alive
        self.on_response = on_response
        # request state (filled by uvicorn's protocol)
        self.body = Chunks()
        self.more_body = True
        self.disconnected = False
        self.on_disconnect: Callable[[], None] | None = None   # called once when it does
        self.message_event = _Wakeup(loop)
        self.body_read = False
        # response state
        self.response_started = False
        self.response_complete = False
        self.chunked = False
        self.left = 0                       # Content-Length bytes still to send
        self.head: bytes | None = None      # held for the first body message
        self.flush_at: asyncio.Handle | None = None
        self.task: asyncio.Task | None = None    # the task running it, once started

    async def run_asgi(self, app: Any) -> None:
        try:
            lane = getattr(app, "lane", None)     # the proxy's entrance: the cycle itself
            if lane is not None:
                await lane(self)
            else:
                await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self._close()
        else:
            if not self.response_started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self._close()
        finally:
            self.on_response = _nothing

    async def gather_body(self, cap: int, declared: int = 0) -> bytes | bytearray | None:
        """The whole request body (``Chunks.whole``; ``declared``: its Content-Length, 0 when
        it has none), or None when the client went away. More than ``cap`` bytes: ``OverCap``
        (at most one read past it is held)."""
        if declared >= PRESIZED:
            self.body.expect(declared)
        while self.more_body and not self.disconnected:
            if len(self.body) > cap:
                raise OverCap(len(self.body))
            self.flow.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected:
            return None
        if len(self.body) > cap:
            raise OverCap(len(self.body))
        body = self.body.whole()
        self.body = Chunks()
        self.body_read = True
        self.message_event.clear()
        self.flow.resume_reading()
        return body

    def respond(self, status: int, head: bytes, body: bytes) -> None:
        """A whole response in one write, without ASGI messages: ``head`` is its header
        lines (``name: value\r\n`` each, checked by the caller, Content-Length among
        them); the status line, uvicorn's default headers and ``connection: close`` when
        the connection closes after it are added here. Nothing is sent to a client that
        has gone."""
        if self.disconnected:
            return
        if self.response_started:
            raise RuntimeError("Unexpected response, after response already started.")
        self.response_started = self.response_complete = True
        self.transport.write(b"".join((     # a join: cheaper than a %-format
            STATUS_LINES.get(status) or status_line(status), default_lines(self.default_headers),
            head, b"\r\n" if self.keep_alive else b"connection: close\r\n\r\n",
            b"" if status in NO_BODY or status < 200 else body)))
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()

    async def receive(self) -> dict:
        while not (self.disconnected or self.response_complete):
            if not self.body_read and (self.body or not self.more_body):
                body, more = bytes(self.body), self.more_body
                self.body.clear()
                self.body_read = not more
                self.message_event.clear()        # seen: wait for what comes next
                self.flow.resume_reading()
                return {"type": "http.request", "body": body, "more_body": more}
            self.flow.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got "
                                   f"'{kind}'.")
            self._start(message["status"], message.get("headers", ()))
            return
        if self.response_complete or kind != "http.response.body":
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response "
                               "already " + ("completed." if self.response_complete else
                                             "started."))
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self.chunked:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
        else:
            if len(body) > self.left:
                raise RuntimeError("Response content longer than Content-Length")
            self.left -= len(body)
            data = body
        head = self.head
        if head is not None:
            self.head = None
            self.flush_at.cancel()
            data = head + data
        if data:
            self.transport.write(data)
        if not more:
            if self.left:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    def _start(self, status: int, headers: Any) -> None:
        parts = [STATUS_LINES.get(status) or status_line(status)]
        length = None
        chunked = closing = False
        good = GOOD_NAMES
        for group in (self.default_headers, headers):
            for name, value in group:
                if name not in good:
                    check_name(name)
                if BAD_VALUE.search(value):
                    check_value(name, value)
                name = name.lower()
                if name == b"content-length":
                    if length is None:
                        length = int(value)
                elif name == b"transfer-encoding":
                    chunked = chunked or value.lower() == b"chunked"
                elif name == b"connection":
                    if b"close" in (t.strip().lower() for t in value.split(b",")):
                        self.keep_alive, closing = False, True
                parts += (name, b": ", value, b"\r\n")
        if not self.keep_alive and not closing:
            parts.append(b"connection: close\r\n")
        if status in NO_BODY or status < 200:
            length, chunked = 0, False
        elif length is None and not chunked:
            chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
        parts.append(b"\r\n")
        self.response_started = True
        self.chunked = chunked and length is None
        self.left = 0 if self.chunked else (length or 0)
        self.head = b"".join(parts)
        self.flush_at = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        head = self.head
        if head is not None:
            self.head = None
            if not self.transport.is_closing():
                self.transport.write(head)

    def _close(self) -> None:
        self._flush()
        self.transport.close()

    async def _send_500(self) -> None:
        await self.send({"type": "http.response.start", "status": 500, "headers": [
            (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"),
            (b"connection", b"close")]})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})


def _nothing() -> None:
    pass
