"""A whole answer of an upstream passed on to the client, or the relay's error answer.

What reaches the client is JSON: a 2xx body that is not is a failed attempt (502, retried
elsewhere, counted against the upstream's breaker at once); a 4xx or 5xx body that is not is
replaced by an error envelope with the upstream's status (the client may have caused those, so
they count against no breaker for it)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from engine_advisor.service.proxy.relay.failure import Failure, error_bytes, retry_after
from engine_advisor.service.proxy.relay.observe import COMPLETION, observe
from engine_advisor.service.proxy.relay.passed import PASS_RESPONSE, passed, passed_lines
from engine_advisor.service.proxy.relay.valid import is_json
from engine_advisor.service.proxy.upstreams import Upstream

if TYPE_CHECKING:
    from engine_advisor.service.proxy.relay.reply import Reply

log = logging.getLogger("engine_advisor.proxy")
JSON = [(b"content-type", b"application/json")]


async def answer(relay: Reply, up: Upstream, status: int, headers: list[tuple[bytes, bytes]],
                 body: bytes, sent_at: float, batch: int) -> Failure | None:
    """An upstream's whole answer (``headers``: its response headers): a 429 or 5xx is a
    failure to retry; anything else goes to the client as it came."""
    if status == 429 or status >= 500:
        if status == 429:                 # a 5xx is counted by the attempts (DEFERRED)
            up.breaker.success()
        ra = next((v for k, v in headers if k == b"retry-after"), None)
        after = retry_after(ra.decode("latin-1") if ra else None)
        if after:
            up.not_before = time.monotonic() + min(
                after, relay.pools.config.retries.backoff_max_s * 10)
        if not is_json(body):             # fail() answers with an envelope instead
            body = None
        return Failure("status", f"upstream {up.name} answered {status}", True, status,
                       body, [(k, v) for k, v in headers if k in PASS_RESPONSE], after)
    if not is_json(body) and status != 204:
        if status < 300:
            up.breaker.failure()
            relay.state.metrics.fault(up.name, "invalid")
            log.warning("upstream %s: a %d answer that is not JSON", up.name, status)
            return Failure("invalid", f"upstream {up.name} answered {status} with a body that "
                                      "is not JSON", True, 502)
        if status >= 400:
            body = error_bytes(status, f"upstream {up.name} answered {status} with a body "
                                       "that is not JSON")
            headers = [(k, v) for k, v in headers if k != b"content-type"] + JSON
    br = up.breaker
    if not br.closed or br.failures or br.probing:    # else success() changes nothing
        br.success()
    relay.started = True
    relay.final = (up.engine, up.name, status)
    relay.status_code = status
    w = relay.writer
    if w.ready():
        w.whole_now(relay.watch, status, passed_lines(headers), up, body, relay.rid)
    else:
        await w.whole(relay.watch, status, passed(headers), up, body, relay.rid)
    relay.state.metrics.count(up.engine, up.name, status)
    if 200 <= status < 300:
        total = time.perf_counter() - sent_at
        n = COMPLETION.last(body)
        if n is not None:
            observe(relay, up, body, n, None, total, batch)
    return None


async def fail(relay: Reply, failures: list[tuple[Upstream, Failure]]) -> None:
    """No attempt succeeded: the last upstream's own answer as it came, else an error naming
    every attempt."""
    up, last = failures[-1]
    if last.body is not None:
        status, body, headers = last.status, last.body, list(last.headers or [])
    else:
        if all(f.reason == "connect" for _, f in failures):
            status = 503
            msg = ("no upstream is reachable: " + "; ".join(
                f"{u.name}: {f.message}" for u, f in failures))
        else:
            status = last.status
            msg = last.message if len(failures) == 1 else (
                f"{last.message} (after {len(failures)} attempts: "
                + "; ".join(f"{u.name}: {f.reason}" for u, f in failures) + ")")
        body = error_bytes(status, msg, "service_unavailable" if status == 503 else
                           "upstream_timeout" if status == 504 else "upstream_error")
        headers = list(JSON)
    relay.final = (up.engine, up.name, status)
    relay.state.metrics.count(up.engine, up.name, status)
    relay.status_code = status
    await relay.writer.whole(relay.watch, status, headers, up, body, relay.rid)
