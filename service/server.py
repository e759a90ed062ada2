"""uvicorn's httptools protocol with two changes for the proxy's hot path.

``engine-advisor serve`` runs uvicorn with ``http=ServerProtocol``. Parsing, keep-alive,
pipelining, timeouts, flow control and shutdown stay uvicorn's; what changes:

1. One write per response head and first body bytes. uvicorn writes the status line and
   headers (``http.response.start``) and the body (``http.response.body``) with two
   ``transport.write`` calls: with uvloop, which sends at once, two system calls and two TCP
   segments per response, and a client woken up twice. Here the head is held until the
   response's first body message and both leave together; a head with no body message in the
   same event-loop iteration (a stream whose first bytes are not ready, a HEAD request) is
   written at the end of that iteration.
2. A direct lane for ``POST /v1/completions`` and ``/v1/chat/completions`` (exact paths, no
   query, no ``Expect: 100-continue``, no upgrade; without ``--access-log``, a root path or a
   concurrency limit): the request goes straight to the proxy's ``DirectPath`` with a
   ``DirectCycle``, this module's leaner ASGI ``receive``/``send`` (no ``asyncio.Event``, the
   response framed and validated here and written as in 1), instead of uvicorn's
   ``RequestResponseCycle`` behind its ``ProxyHeadersMiddleware`` and the app's dispatch. Those
   layers cost a sizeable share of a proxied request's CPU (docs/benchmarks.md, proxy section);
   ``X-Forwarded-*`` headers only change ``scope["client"]``/``["scheme"]``, which the two
   routes never read.

3. The keep-alive timeout that uvicorn arms after every response (and cancels when the next
   request arrives) is kept on one shared clock per event loop (``KeepAliveClock``: never
   early, up to a second late) instead of an event-loop timer per response: under uvloop each
   such timer is a libuv handle, a few microseconds per request.

``DirectCycle`` gives uvicorn's protocol the attributes it uses on a cycle (``body``,
``more_body``, ``message_event``, ``response_complete``, ``disconnected``, ``keep_alive``,
``run_asgi``), so the protocol's own body, disconnect, pipelining and shutdown handling apply
to it unchanged. The proxy's ``DirectPath`` works on the cycle itself (its ``lane``) rather
than through ``receive``/``send``: ``whole_body`` (a body that has all arrived),
``respond`` (a whole response in one write, header lines checked by the caller), ``task``
(the request's task) and ``on_disconnect`` (called from ``connection_lost``). No object of a
request refers back to the cycle, so each request is freed by reference counting, not left
to the cyclic garbage collector.
"""

from __future__ import annotations

import asyncio
import contextvars
import http
import logging
import re
import weakref
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from service.frontdoor import LINGER_S, FrontDoor, refusal

PROTOCOL = "service.server:ServerProtocol"
DIRECT_URLS = frozenset({b"/v1/completions", b"/v1/chat/completions"})

# RFC 9110 tokens for names; no control characters but HTAB in values (no CR/LF: no splitting)
BAD_NAME = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")
BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
NO_BODY = frozenset({204, 304})
TASK_NAME = "direct lane"
log = logging.getLogger("uvicorn.error")
DEFAULT_DOOR = FrontDoor()


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


STATUS_LINES = {s: _status_line(s) for s in range(100, 600)}
_GOOD_NAMES: set[bytes] = set()             # header names already checked (a bounded set)


def _check_name(name: bytes) -> None:
    if not name or BAD_NAME.search(name):
        raise RuntimeError(f"invalid HTTP header name {name[:40]!r}")
    if len(_GOOD_NAMES) < 1024:
        _GOOD_NAMES.add(name)


# ----------------------------------------------------------------------------- 1. coalescing
class _CycleTransport:
    """What one of uvicorn's request cycles writes through: the real transport, except that
    the response head (the first write once the cycle has started its response) is held for
    the next write, or for the end of this event-loop iteration."""

    __slots__ = ("transport", "loop", "cycle", "held", "flush_at")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 cycle: RequestResponseCycle):
        self.transport = transport
        self.loop = loop
        self.cycle: RequestResponseCycle | None = cycle    # until its head is written
        self.held: bytes | None = None
        self.flush_at: asyncio.Handle | None = None

    def write(self, data: bytes) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.response_started:   # before: only "100 Continue"
            self.cycle = None
            self.held = data
            self.flush_at = self.loop.call_soon(self.flush)
            return
        held = self.held
        if held is not None:
            self.held = None
            self.flush_at.cancel()
            data = held + data
        self.transport.write(data)

    def flush(self) -> None:
        held = self.held
        if held is not None:
            self.held = None
            if not self.transport.is_closing():
                self.transport.write(held)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:        # anything else: the real transport's
        return getattr(self.transport, name)


# ----------------------------------------------------------------------------- 2. direct lane
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


class DirectCycle:
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
        self.body = bytearray()
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
            lane = getattr(app, "lane", None)     # DirectPath: the cycle itself, no ASGI
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

    def whole_body(self) -> bytes | None:
        """The request body when all of it has arrived and none was read yet, else None
        (then read it with ``receive``)."""
        if self.more_body or self.body_read or self.disconnected:
            return None
        self.body_read = True
        body = bytes(self.body)
        self.body.clear()
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
            STATUS_LINES.get(status) or _status_line(status), _defaults(self.default_headers),
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
        parts = [STATUS_LINES.get(status) or _status_line(status)]
        length = None
        chunked = closing = False
        good = _GOOD_NAMES
        for group in (self.default_headers, headers):
            for name, value in group:
                if name not in good:
                    _check_name(name)
                if BAD_VALUE.search(value):
                    raise RuntimeError(f"invalid HTTP header value for {name[:40]!r}")
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


_default_lines: tuple[list, bytes] = ([], b"")


def _defaults(headers: list[tuple[bytes, bytes]]) -> bytes:
    """uvicorn's default headers (``date`` and ``--header`` ones) as header lines: checked
    and encoded once per list (uvicorn makes a new one every second)."""
    global _default_lines
    seen, lines = _default_lines
    if headers is seen:
        return lines
    parts = []
    for name, value in headers:
        if name not in _GOOD_NAMES:
            _check_name(name)
        if BAD_VALUE.search(value):
            raise RuntimeError(f"invalid HTTP header value for {name[:40]!r}")
        parts += (name.lower(), b": ", value, b"\r\n")
    lines = b"".join(parts)
    _default_lines = (headers, lines)
    return lines


# ----------------------------------------------------------------------------- 3. keep-alive
class _Alarm:
    """One keep-alive timeout (what uvicorn keeps as ``timeout_keep_alive_task``)."""

    __slots__ = ("clock", "when", "callback")

    def __init__(self, clock: KeepAliveClock, when: float, callback: Callable[[], None]):
        self.clock, self.when, self.callback = clock, when, callback

    def cancel(self) -> None:
        self.clock.alarms.pop(self, None)


class KeepAliveClock:
    """The keep-alive timeouts of one event loop's connections, checked every ``TICK``
    seconds while any is set."""

    TICK = 1.0
    _clocks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.alarms: dict[_Alarm, None] = {}
        self.timer: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> KeepAliveClock:
        clock = cls._clocks.get(loop)
        if clock is None:
            clock = cls._clocks[loop] = cls(loop)
        return clock

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Alarm:
        alarm = _Alarm(self, self.loop.time() + delay, callback)
        self.alarms[alarm] = None
        if self.timer is None:
            self.timer = self.loop.call_later(self.TICK, self._check)
        return alarm

    def _check(self) -> None:
        now = self.loop.time()
        for alarm in [a for a in self.alarms if a.when <= now]:
            if self.alarms.pop(alarm, 0) is None:      # not cancelled by an earlier callback
                alarm.callback()
        self.timer = self.loop.call_later(self.TICK, self._check) if self.alarms else None


class _Loop:
    """The event loop as uvicorn's protocol uses it (``create_task``, ``call_later`` for
    the keep-alive timeout only): the loop's own ``create_task``, the shared clock's
    ``call_later``."""

    __slots__ = ("create_task", "call_later")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.create_task = loop.create_task
        self.call_later = KeepAliveClock.of(loop).call_later


def _direct_app(app: Any) -> tuple[Any, Any]:
    """(the app, its ``direct`` ASGI app) when ``app`` is engine-advisor's, reached at most
    through uvicorn's ProxyHeadersMiddleware; else (None, None)."""
    if isinstance(app, ProxyHeadersMiddleware):
        app = app.app
    direct = getattr(app, "direct", None)
    return (app, direct) if direct is not None else (None, None)


def _front_door(app: Any) -> FrontDoor:
    """The app's limits (``App.front_door``, from the settings), else the defaults."""
    if isinstance(app, ProxyHeadersMiddleware):
        app = app.app
    door = getattr(app, "front_door", None)
    return door if isinstance(door, FrontDoor) else DEFAULT_DOOR


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request the front door refuses."""


class ServerProtocol(HttpToolsProtocol):
    """See the module docstring; and 4. the front door's limits (service.frontdoor)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.event_loop = self.loop
        self.loop = _Loop(self.loop)              # uvicorn's use of it: see _Loop
        self.direct_app, self.direct = _direct_app(self.app)
        self.lane = (self.direct is not None and not self.root_path and not self.access_log
                     and self.limit_concurrency is None)
        self.door = _front_door(self.app)
        # 4. the request head under way: its bytes fed to the parser (whole lines) and held
        # (a partial line), its header fields; alarms of the head and body timeouts
        self.in_head = True
        self.head_fed = 0
        self.held = bytearray()
        self.head_measured = False      # the head's size was checked as it arrived
        self.finished = self.headers    # the headers list of the last complete message
        self.head_alarm: _Alarm | None = None
        self.body_alarm: _Alarm | None = None
        self.refusal: tuple[int, str, str | None, str] | None = None
        self.refusing = False           # a refusal is written: input is dropped until close

    # ------------------------------------------------------------------ 4. front door
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        cap = self.door.max_connections
        if cap is not None and len(self.connections) >= cap:
            self.transport = transport
            self.door.refused("connections")
            self._write_refusal(refusal(
                503, f"too many connections: this process serves at most {cap:,} at once; "
                     "retry later", extra=b"retry-after: 1\r\n"))
            return
        super().connection_made(transport)
        self.head_alarm = self.loop.call_later(self.door.header_timeout_s, self._head_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_alarms()
        cycle = self.cycle
        super().connection_lost(exc)
        if isinstance(cycle, DirectCycle) and cycle.disconnected \
                and cycle.on_disconnect is not None:
            call, cycle.on_disconnect = cycle.on_disconnect, None
            call()

    def data_received(self, data: bytes) -> None:
        if self.refusing:
            return                               # dropped: the connection is closing
        if self.timeout_keep_alive_task is not None:
            self._unset_keepalive_if_required()
        if self.in_head:
            if not self.held and not self.head_fed:
                # measured from its first byte, unless the parser began it already (a
                # pipelined head begun in the previous request's bytes: a new headers list)
                self.head_measured = self.headers is self.finished
            # the usual case, a whole head (within the limit) in these bytes: parsed at once
            if self.held or not 0 <= data.find(b"\r\n\r\n") <= (
                    self.door.header_bytes - 4 - self.head_fed):
                self._head_in_pieces(data)
                return
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._parse_error(exc)
            return
        if not self.in_head:
            self._body_clock()

    def _head_in_pieces(self, data: bytes) -> None:
        data = self._head_lines(data)
        if data:
            self._feed(data)
        if self.refusing:
            return
        if self.in_head:
            if (self.held or self.head_fed) and self.head_alarm is None:
                # a head under way (not the first of the connection): its clock runs
                self.head_alarm = self.loop.call_later(self.door.header_timeout_s,
                                                       self._head_timeout)
        else:
            self._body_clock()

    def _body_clock(self) -> None:
        """A body under way: its clock runs (from the end of its head)."""
        cycle = self.cycle
        if self.body_alarm is None and cycle is not None and cycle.more_body \
                and not cycle.response_complete and not self.refusing:
            self.body_alarm = self.loop.call_later(self.door.body_timeout_s,
                                                   self._body_timeout)

    def _head_lines(self, data: bytes) -> bytes:
        """Of ``data`` arriving while a request head is incomplete, what the parser gets now:
        everything once the head's end is there, else its whole lines (the partial last line
        is held). The parser joins the pieces of a line it is given one by one, each join a
        copy of the whole line so far: given whole lines, it never joins; and a head past
        ``header_bytes`` is refused before it is parsed."""
        limit = self.door.header_bytes
        held = self.held
        if held:
            start = len(held)
            held += data
            data = held
        else:
            start = 0
        end = data.find(b"\r\n\r\n", max(start - 3, 0))
        if end >= 0:
            if self.head_fed + end + 4 > limit:
                self._refuse_head()
                return b""
            out = bytes(data) if held else data
            held.clear()
            return out
        if self.head_fed + len(data) > limit:
            self._refuse_head()
            return b""
        cut = data.rfind(b"\n", start) + 1
        if cut == 0:
            if not held:
                held += data
            return b""
        self.head_fed += cut
        if cut == len(data):
            out = bytes(data) if held else data
            held.clear()
            return out
        out = bytes(data[:cut])
        if held:
            del held[:cut]
        else:
            held += data[cut:]
        return out

    def _feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._parse_error(exc)
            return
        if not self.in_head and self.held:       # the head ended inside the lines given:
            rest = bytes(self.held)              # what was held is the body (or next head)
            self.held.clear()
            self._feed(rest)

    def _parse_error(self, exc: Exception) -> None:
        """As uvicorn's ``data_received``: an upgrade, or a 400; or the front door's refusal
        a parser callback of ours raised."""
        if isinstance(exc, httptools.HttpParserUpgrade):
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        elif self.refusal is not None:
            self._refuse(*self.refusal)
        else:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect":
            if value.lower() == b"100-continue":
                self.expect_100_continue = True
        elif name == b"transfer-encoding" and value.strip().lower() != b"chunked":
            self._stop(501, f"transfer-encoding {value[:40].decode('latin-1')!r} is not "
                            "supported: only 'chunked'", "transfer-encoding",
                       "transfer_encoding")
        self.headers.append((name, value))

    def _stop(self, status: int, message: str, param: str | None, reason: str) -> None:
        self.refusal = (status, message, param, reason)
        raise _Refused(message)

    def on_message_complete(self) -> None:
        self.in_head = True
        self.finished = self.headers          # the next message's begin makes a new list
        if self.body_alarm is not None:
            self.body_alarm.cancel()
            self.body_alarm = None
        # uvicorn's own (as a call of it costs)
        if (self.parser.should_upgrade() and self._should_upgrade()) \
                or self.cycle.response_complete:
            return
        self.cycle.more_body = False
        self.cycle.message_event.set()

    def _too_large(self) -> str:
        return f"request head too large: more than {self.door.header_bytes:,} bytes"

    def _refuse_head(self) -> None:
        self._refuse(431, self._too_large(), None, "header_bytes")

    def _head_timeout(self) -> None:
        self.head_alarm = None
        if self.refusing or self.transport.is_closing():
            return
        if self.held or self.head_fed:
            self._refuse(408, f"request head not received within "
                              f"{self.door.header_timeout_s:g} s", None, "header_timeout")
        elif self.cycle is None or self.cycle.response_complete:
            self.door.refused("idle")            # connected, and sent nothing since
            self.transport.close()

    def _body_timeout(self) -> None:
        self.body_alarm = None
        cycle = self.cycle
        if self.refusing or cycle is None or not cycle.more_body:
            return
        if cycle.response_started:               # answered without its body: just close
            self.door.refused("body_timeout")
            self.refusing = True
            self._cancel_alarms()
            self.transport.close()
            return
        cycle.disconnected = True                # its app reads no more body: it is gone
        cycle.message_event.set()
        self._refuse(408, f"request body not received within {self.door.body_timeout_s:g} s "
                          "of its head", None, "body_timeout", body=True)

    def _refuse(self, status: int, message: str, param: str | None, reason: str,
                body: bool = False) -> None:
        """Answer ``status`` and close. A head refused while an earlier request of the
        connection (pipelined) is still answered: that answer goes out, then the close."""
        self.door.refused(reason)
        self.refusal = None
        cycle = self.cycle
        if not body and cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            self.refusing = True
            self.pipeline.clear()
            self._cancel_alarms()
            return
        self._write_refusal(refusal(status, message, param))

    def _write_refusal(self, data: bytes) -> None:
        self.refusing = True
        self._cancel_alarms()
        transport = self.transport
        transport.write(data)
        door = self.door
        if transport.can_write_eof() and door.lingering < door.lingering_max:
            transport.write_eof()               # the answer, then our end of the stream
            door.lingering += 1
            self.event_loop.call_later(LINGER_S, self._linger_end)
        else:
            transport.close()

    def _linger_end(self) -> None:
        self.door.lingering -= 1
        self.transport.close()

    def _cancel_alarms(self) -> None:
        for alarm in (self.head_alarm, self.body_alarm):
            if alarm is not None:
                alarm.cancel()
        self.head_alarm = self.body_alarm = None

    # ------------------------------------------------------------------ 2. direct lane
    def on_headers_complete(self) -> None:
        # 4. the head is complete: its clock stops; over a limit, parsing stops. A head not
        # measured as it arrived (a pipelined one begun in the previous request's bytes) is
        # measured here, from the parsed URL and fields
        self.in_head = False
        self.head_fed = 0
        if self.head_alarm is not None:
            self.head_alarm.cancel()
            self.head_alarm = None
        door = self.door
        if not self.head_measured and len(self.url) + sum(
                len(k) + len(v) + 4 for k, v in self.headers) > door.header_bytes:
            self._stop(431, self._too_large(), None, "header_bytes")
        self.head_measured = False
        if len(self.headers) > door.header_fields:
            self._stop(431, f"request head too large: more than {door.header_fields} header "
                            "fields", None, "header_fields")
        if (self.lane and self.url in DIRECT_URLS and not self.expect_100_continue
                and self.parser.get_method() == b"POST" and not self.parser.should_upgrade()):
            self._direct()
            return
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not before:
            cycle.transport = _CycleTransport(cycle.transport, self.event_loop, cycle)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if not isinstance(cycle, DirectCycle):
            super()._start_asgi_task(cycle, app)
            return
        # as uvicorn's, the task also kept on the cycle (its request needs no lookup); made
        # here with a fixed name when the loop has no task factory (create_task would format
        # "Task-<n>" for each)
        loop = self.event_loop
        context = contextvars.Context() if self.config.reset_contextvars else None
        if loop.get_task_factory() is None:
            task = asyncio.Task(cycle.run_asgi(app), loop=loop, name=TASK_NAME, context=context)
        else:
            task = loop.create_task(cycle.run_asgi(app), context=context)
        cycle.task = task
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def _direct(self) -> None:
        version = self.parser.get_http_version()
        scope = self.scope
        scope["method"] = "POST"
        if version != "1.1":
            scope["http_version"] = version
        scope["path"] = self.url.decode("ascii")
        scope["raw_path"] = self.url
        scope["query_string"] = b""
        scope["app"] = self.direct_app
        before = self.cycle
        self.cycle = cycle = DirectCycle(
            scope, self.transport, self.flow, self.event_loop, self.server_state.default_headers,
            version != "1.0" and self.parser.should_keep_alive(), self.on_response_complete)
        if before is None or before.response_complete:
            self._start_asgi_task(cycle, self.direct)
        else:                                     # pipelined: after the one under way
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.direct))
