"""How a relay writes to its client, and hears it go away.

``LaneWriter``: a request of uvicorn's direct lane (engine_advisor.service.transport.cycle): a whole
response (every non-streaming one, every error before a stream starts) is written as bytes in one
write, the disconnect heard from the connection itself. ``AsgiWriter``: any other server, through
ASGI ``send`` (the disconnect heard through ``receive``). A stream goes through ``send`` on both."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.types import Receive, Send

from engine_advisor.service.proxy.relay.watch import CycleWatch, DisconnectWatch
from engine_advisor.service.proxy.upstreams import Upstream
from engine_advisor.service.transport.headers import header_lines

if TYPE_CHECKING:
    from engine_advisor.service.transport.cycle import LaneCycle

Watch = DisconnectWatch | CycleWatch


class LaneWriter:
    __slots__ = ("cycle", "send")

    def __init__(self, cycle: LaneCycle):
        self.cycle = cycle
        self.send: Send = cycle.send

    def watch(self, task: asyncio.Task) -> Watch:
        return CycleWatch(self.cycle, task)

    def ready(self) -> bool:
        """Whether a whole response can be written now (``whole_now``)."""
        return not self.cycle.flow.write_paused

    def whole_now(self, watch: Watch, status: int, lines: bytes, up: Upstream, body: bytes,
                  rid: bytes) -> None:
        """``lines``: checked header lines; then the upstream's, the length and the id."""
        watch.close()
        self.cycle.respond(status, b"".join((lines, up.lines, b"content-length: %d\r\n"
                                             b"x-request-id: " % len(body), rid, b"\r\n")),
                           body)

    async def whole(self, watch: Watch, status: int, headers: list[tuple[bytes, bytes]],
                    up: Upstream, body: bytes, rid: bytes) -> None:
        cycle = self.cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        self.whole_now(watch, status, header_lines(headers), up, body, rid)


class AsgiWriter:
    __slots__ = ("receive", "send")

    def __init__(self, receive: Receive, send: Send):
        self.receive, self.send = receive, send

    def watch(self, task: asyncio.Task) -> Watch:
        return DisconnectWatch(self.receive, task)

    def ready(self) -> bool:
        return False

    async def whole(self, watch: Watch, status: int, headers: list[tuple[bytes, bytes]],
                    up: Upstream, body: bytes, rid: bytes) -> None:
        """Nothing is left to cancel once the body is sent in one message, so the watch
        ends first (the response's end then wakes nobody)."""
        watch.close()
        headers += [(b"x-engine-advisor-engine", up.engine.encode()),
                    (b"x-engine-advisor-upstream", up.name.encode()),
                    (b"content-length", b"%d" % len(body)), (b"x-request-id", rid)]
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": body, "more_body": False})
