"""uvicorn's httptools protocol, with the front door's limits and a direct lane to the proxy.

``engine-advisor serve`` runs uvicorn with ``http=PROTOCOL``. Parsing, keep-alive, pipelining,
timeouts, flow control and shutdown stay uvicorn's; what changes:

- The front door's limits (engine_advisor.service.frontdoor): the size and field count of a request
  head,
  the time a head and a body may take, the connections one process keeps; each refusal is an
  error envelope and a close.
- A direct lane for the proxy's entrance paths (``PROXY_URLS``: exact paths, ``POST``, no
  query, no ``Expect: 100-continue``, no upgrade; without ``--access-log``, a root path or a
  concurrency limit): the request goes to the app's ``entrance`` on a ``LaneCycle``
  (engine_advisor.service.transport.cycle) instead of uvicorn's ``RequestResponseCycle`` behind its
  ``ProxyHeadersMiddleware`` and the app's dispatch. Those layers cost a sizeable share of a
  proxied request's CPU (docs/benchmarks.md, proxy section); ``X-Forwarded-*`` headers only
  change ``scope["client"]``/``["scheme"]``, which the proxy never reads.
- Every other request's head and first body bytes leave in one write
  (engine_advisor.service.transport.coalesce); keep-alive timeouts run on one shared clock
  (engine_advisor.service.transport.keepalive).

This subclass uses uvicorn's internals (the cycle's attributes, ``pipeline``, ``flow``,
``_unset_keepalive_if_required``, ``_should_upgrade``...), so uvicorn is pinned to the versions
it is tested with: ``UVICORN_TESTED`` here and the range in pyproject.toml
(tests/service/test_transport.py checks both).
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import httptools
import uvicorn
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from engine_advisor.service.frontdoor import LINGER_S, FrontDoor, refusal
from engine_advisor.service.transport.coalesce import HeldHead
from engine_advisor.service.transport.cycle import LaneCycle
from engine_advisor.service.transport.keepalive import Alarm, KeepAliveLoop

PROTOCOL = "engine_advisor.service.transport.protocol:HttpProtocol"
PROXY_URLS = frozenset({b"/v1/completions", b"/v1/chat/completions", b"/generate"})
UVICORN_TESTED = ((0, 54), (0, 55))       # uvicorn versions >= the first, < the second
TASK_NAME = "direct lane"
DEFAULT_DOOR = FrontDoor()


def uvicorn_version_ok(version: str = uvicorn.__version__) -> bool:
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    return UVICORN_TESTED[0] <= parts < UVICORN_TESTED[1]


def _entrance_app(app: Any) -> tuple[Any, Any]:
    """(the app, its proxy ``entrance``) when ``app`` is engine-advisor's, reached at most
    through uvicorn's ProxyHeadersMiddleware; else (None, None)."""
    if isinstance(app, ProxyHeadersMiddleware):
        app = app.app
    direct = getattr(app, "entrance", None)
    return (app, direct) if direct is not None else (None, None)


def _front_door(app: Any) -> FrontDoor:
    """The app's limits (``App.front_door``, from the settings), else the defaults."""
    if isinstance(app, ProxyHeadersMiddleware):
        app = app.app
    door = getattr(app, "front_door", None)
    return door if isinstance(door, FrontDoor) else DEFAULT_DOOR


class _Refused(Exception):
    """Raised in a parser callback to stop parsing a request the front door refuses."""


class HttpProtocol(HttpToolsProtocol):
    """See the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.event_loop = self.loop
        self.loop = KeepAliveLoop(self.loop)      # uvicorn's use of it: see KeepAliveLoop
        self.entrance_app, self.entrance = _entrance_app(self.app)
        self.lane = (self.entrance is not None and not self.root_path and not self.access_log
                     and self.limit_concurrency is None)
        self.door = _front_door(self.app)
        # the front door: the request head under way: its bytes fed to the parser (whole
        # lines) and held (a partial line), its header fields; alarms of the head and body
        # timeouts
        self.in_head = True
        self.head_fed = 0
        self.held = bytearray()
        self.head_measured = False      # the head's size was checked as it arrived
        self.finished = self.headers    # the headers list of the last complete message
        self.head_alarm: Alarm | None = None
        self.body_alarm: Alarm | None = None
        self.refusal: tuple[int, str, str | None, str] | None = None
        self.refusing = False           # a refusal is written: input is dropped until close

    # ------------------------------------------------------------------ the front door
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
        if isinstance(cycle, LaneCycle) and cycle.disconnected \
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

    # ------------------------------------------------------------------ the direct lane
    def on_headers_complete(self) -> None:
        # the front door: the head is complete: its clock stops; over a limit, parsing stops.
        # A head not measured as it arrived (a pipelined one begun in the previous request's
        # bytes) is measured here, from the parsed URL and fields
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
        if (self.lane and self.url in PROXY_URLS and not self.expect_100_continue
                and self.parser.get_method() == b"POST" and not self.parser.should_upgrade()):
            self._direct()
            return
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not before:
            cycle.transport = HeldHead(cycle.transport, self.event_loop, cycle)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if not isinstance(cycle, LaneCycle):
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
        scope["app"] = self.entrance_app
        before = self.cycle
        self.cycle = cycle = LaneCycle(
            scope, self.transport, self.flow, self.event_loop, self.server_state.default_headers,
            version != "1.0" and self.parser.should_keep_alive(), self.on_response_complete)
        if before is None or before.response_complete:
            self._start_asgi_task(cycle, self.entrance)
        else:                                     # pipelined: after the one under way
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, self.entrance))
