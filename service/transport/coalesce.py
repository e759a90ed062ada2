"""One write per response head and first body bytes, for uvicorn's own request cycles.

uvicorn writes the status line and headers (``http.response.start``) and the body
(``http.response.body``) with two ``transport.write`` calls: with uvloop, which sends at once,
two system calls and two TCP segments per response, and a client woken up twice. ``HeldHead``
holds the head until the response's first body message and both leave together; a head with
no body message in the same event-loop iteration (a stream whose first bytes are not ready, a
HEAD request) is written at the end of that iteration. (The direct lane's cycle,
engine_advisor.service.transport.cycle, does the same itself.)
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


class HeldHead:
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
