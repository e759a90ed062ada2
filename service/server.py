"""uvicorn's httptools protocol, writing each response's head and first body bytes at once.

uvicorn writes the status line and headers (``http.response.start``) and the body
(``http.response.body``) with two ``transport.write`` calls. With uvloop, which sends at once,
that is two system calls and two TCP segments per response, and a client that is woken up
twice: on loopback the client's CPU and the server's per request both grow noticeably
(docs/benchmarks.md, proxy section). Here the head is held until the response's first body
message and both leave in one write; a head with no body message in the same event-loop
iteration (a streaming response whose first bytes are not ready yet, a HEAD request) is
written at the end of that iteration. Nothing else of uvicorn's behaviour changes.

``engine-advisor serve`` runs uvicorn with ``http=HeadCoalescingProtocol``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

PROTOCOL = "service.server:HeadCoalescingProtocol"


class _CycleTransport:
    """What one request's cycle writes through: the real transport, except that the response
    head (the first write once the cycle has started its response) is held for the next
    write, or for the end of this event-loop iteration."""

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


class HeadCoalescingProtocol(HttpToolsProtocol):
    def on_headers_complete(self) -> None:
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not before:
            cycle.transport = _CycleTransport(cycle.transport, self.loop, cycle)
