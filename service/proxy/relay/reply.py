"""``Reply``: a proxied request's answer to its client as it goes: what has been sent, from which
upstream, the phase of the attempt's deadline, and the error event that ends a cut stream.

The attempts (engine_advisor.service.proxy.relay.attempts: ``Relay``, a ``Reply``) set it up; what
passes an upstream's answer on (``whole``, ``stream``) and what a finished request teaches
(``observe``) read and write it, and need nothing of the attempts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from engine_advisor.service.proxy.relay.failure import Failure, error_bytes
from engine_advisor.service.proxy.upstreams import Upstream

if TYPE_CHECKING:
    from engine_advisor.service.proxy.decision import Decision
    from engine_advisor.service.proxy.relay.writer import AsgiWriter, LaneWriter, Watch
    from engine_advisor.service.proxy.state import ProxyState
    from engine_advisor.service.proxy.upstreams import Pools

log = logging.getLogger("engine_advisor.proxy")


class Reply:
    """One request's answer to its client; its fields are set by ``Relay``."""

    __slots__ = ("state", "pools", "decision", "prompt_tokens", "rid", "started", "finished",
                 "final", "status_code", "watch", "writer", "loop", "phase")

    state: ProxyState
    pools: Pools
    decision: Decision
    prompt_tokens: int
    rid: bytes                    # the request id
    started: bool                 # the client has been sent the response's head
    finished: bool                # the client's response is complete (streams: [DONE] sent)
    final: tuple[str, str, int] | None     # engine, upstream, status
    status_code: int              # what the client was sent (500: nothing)
    watch: Watch                  # the client going away
    writer: LaneWriter | AsgiWriter
    loop: asyncio.AbstractEventLoop
    phase: str                    # the deadline's: first | idle | total | grace

    async def failed_midway(self, up: Upstream, f: Failure) -> Failure | None:
        """Before any byte reached the client: the failure (maybe retried). After: an error
        event ends the stream (unless the client's stream has already ended)."""
        if not self.started:
            return f
        if self.finished:
            log.info("upstream %s after [DONE]: %s", up.name, f.message)
            return None
        log.warning("stream from %s cut: %s", up.name, f.message)
        err = b"data: " + error_bytes(f.status, f.message + "; the stream is incomplete",
                                      "upstream_error") + b"\n\n"
        self.final = (up.engine, up.name, f.status)
        self.state.metrics.count(up.engine, up.name, f.status)
        try:
            await self.writer.send({"type": "http.response.body", "body": err,
                                    "more_body": False})
        except OSError:
            pass
        return None
