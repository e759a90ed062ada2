"""A streamed answer passed on event by event, whole events only, each data line JSON.

The stream is over at ``[DONE]``: the client's response ends in the same write, and the request is
counted and observed then. The upstream then has ``end_grace_s`` (the relay's phase ``grace``, on
the attempt's deadline) to end its response, so that its connection can be reused; past it, or when
that end is malformed, the connection is closed and counted as an ``unended`` upstream fault
(engine_advisor.service.proxy.relay.attempts), and the client never waits for it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from engine_advisor.service.proxy.relay.failure import Failure
from engine_advisor.service.proxy.relay.observe import COMPLETION, observe
from engine_advisor.service.proxy.relay.passed import passed
from engine_advisor.service.proxy.relay.valid import first_invalid
from engine_advisor.service.proxy.upstreams import Upstream
from engine_advisor.service.transport.client import LimitError, UpstreamError
from engine_advisor.service.transport.client import Response as Http1Response

if TYPE_CHECKING:
    from engine_advisor.service.proxy.relay.reply import Reply

log = logging.getLogger("engine_advisor.proxy")

DONE = b"data: [DONE]"


def event_end(buf: bytes) -> int:
    """Index just past the last complete SSE event in ``buf`` (0: none)."""
    a = buf.rfind(b"\n\n")
    b = buf.rfind(b"\r\n\r\n")
    return max(a + 2 if a >= 0 else 0, b + 4 if b >= 0 else 0)


def ends_with_done(events: bytes) -> bool:
    """Whether the last of these complete events is ``data: [DONE]`` (not a token whose text
    happens to contain it)."""
    body = events.rstrip(b"\r\n")
    k = len(body) - len(DONE)
    return body.endswith(DONE) and (k == 0 or body[k - 1] == 0x0A)


async def stream(relay: Reply, up: Upstream, resp: Http1Response, cm, deadline: float,
                 sent_at: float, batch: int) -> Failure | None:
    """``resp``: a 2xx streamed answer; ``cm``: the attempt's deadline, moved on as events
    arrive (first byte, idle, total, then the grace after [DONE])."""
    loop = relay.loop
    send = relay.writer.send
    idle_s = up.idle_s
    pending = b""
    last = b""
    ttft = None
    events = skipped = 0
    ended = False
    chunks = resp.body()
    cap = relay.pools.config.limits.event_bytes
    async for chunk in chunks:
        buf = pending + chunk if pending else chunk
        end = event_end(buf)
        if len(buf) - end > cap:            # the event under way, not yet ended
            raise LimitError(f"an event over {cap} bytes")
        if end == 0:
            pending = buf
            continue
        out, pending = (buf, b"") if end == len(buf) else (buf[:end], buf[end:])
        bad = first_invalid(out)
        if bad >= 0:
            return await invalid(relay, up, out[:bad])
        cm.reschedule(None)
        if not relay.started:
            ttft = time.perf_counter() - sent_at
            headers = passed(resp.headers)
            headers.append((b"x-engine-advisor-engine", up.engine.encode()))
            headers.append((b"x-engine-advisor-upstream", up.name.encode()))
            if not any(k == b"content-type" for k, _ in headers):
                headers.append((b"content-type", b"text/event-stream"))
            headers.append((b"x-accel-buffering", b"no"))
            headers.append((b"x-request-id", relay.rid))
            relay.status_code = resp.status
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": headers})
            relay.started = True
            relay.final = (up.engine, up.name, resp.status)
        # [DONE] ends the client's stream in the same write; from then on the client's
        # going away cancels nothing (the request is answered)
        ended = ends_with_done(out)
        if ended:
            relay.watch.close()
        await send({"type": "http.response.body", "body": out, "more_body": not ended})
        events += out.count(b"\n\n") or out.count(b"\r\n\r\n")
        skipped += out.count(b'"choices":[]') + out.count(b'"content":""') + out.count(DONE)
        last = out
        if ended:
            break
        relay.phase = "idle" if loop.time() + idle_s < deadline else "total"
        cm.reschedule(min(loop.time() + idle_s, deadline))
    if ended:
        relay.finished = True
        succeeded(relay, up, resp.status, last, events, skipped, ttft, sent_at, batch)
        # the upstream's end of the response (chunked terminator or close), within the grace,
        # so the connection can be reused; anything after [DONE] is dropped
        relay.phase = "grace"
        cm.reschedule(min(loop.time() + up.end_grace_s, deadline))
        try:
            async for _ in chunks:
                pass
        except UpstreamError as exc:   # not reused: release() closes it
            relay.state.metrics.fault(up.name, "unended")
            log.info("upstream %s after [DONE]: %s: %s (connection closed)", up.name,
                     type(exc).__name__, exc)
        cm.reschedule(None)
        return None
    cm.reschedule(None)
    if pending:   # an unterminated last event: pass it on as it came
        if first_invalid(pending) >= 0:
            return await invalid(relay, up, b"")
        if not relay.started:
            return Failure("read", f"upstream {up.name} sent no complete event", True, 502)
        await send({"type": "http.response.body", "body": pending, "more_body": True})
        last = pending
    if not relay.started:
        return Failure("read", f"upstream {up.name} ended the stream without an event",
                       True, 502)
    if not ends_with_done(last):
        up.breaker.failure()
        return await relay.failed_midway(up, Failure(
            "read", f"upstream {up.name} ended the stream before [DONE]", False, 502))
    relay.watch.close()
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    succeeded(relay, up, resp.status, last, events, skipped, ttft, sent_at, batch)
    return None


def succeeded(relay: Reply, up: Upstream, status: int, last: bytes, events: int, skipped: int,
              ttft: float | None, sent_at: float, batch: int) -> None:
    """The client's stream is complete: the breaker, the request's count, its observation."""
    up.breaker.success()
    relay.state.metrics.count(up.engine, up.name, status)
    total = time.perf_counter() - sent_at
    n = COMPLETION.last(last)
    if n is None:
        n = max(events - skipped, 0)
    if n > 0:
        observe(relay, up, last, n, ttft, total, batch)


async def invalid(relay: Reply, up: Upstream, good: bytes) -> Failure | None:
    """A data line that is not JSON: before the first event, a failed attempt (502, retried
    elsewhere); after it, the events before it (``good``) and an error event. Counted against
    the upstream's breaker at once (a probe's garbage opens it again)."""
    up.breaker.failure()
    relay.state.metrics.fault(up.name, "invalid")
    f = Failure("invalid", f"upstream {up.name} sent an event whose data is not JSON",
                not relay.started, 502)
    if not relay.started:
        log.warning("upstream %s: an event whose data is not JSON (connection closed)",
                    up.name)
        return f
    if good:
        await relay.writer.send({"type": "http.response.body", "body": good,
                                 "more_body": True})
    return await relay.failed_midway(up, f)
