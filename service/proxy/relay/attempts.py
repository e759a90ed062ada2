"""``Relay``: one proxied request's attempts over upstreams (see the package docstring)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING

from engine_advisor.service.proxy.decision import Decision, pick
from engine_advisor.service.proxy.health_checker import mark_down
from engine_advisor.service.proxy.relay.failure import DEFERRED, Failure, count_deferred
from engine_advisor.service.proxy.relay.passed import DROP_REQUEST
from engine_advisor.service.proxy.relay.reply import Reply
from engine_advisor.service.proxy.relay.stream import stream
from engine_advisor.service.proxy.relay.whole import answer, fail
from engine_advisor.service.proxy.relay.writer import AsgiWriter, LaneWriter
from engine_advisor.service.proxy.request import ProxyRequest
from engine_advisor.service.proxy.upstreams import Pools, Upstream
from engine_advisor.service.transport.client import (
    ConnectError,
    ConnectTimeout,
    IdleTimeout,
    LimitError,
    PoolTimeout,
    UpstreamError,
)
from engine_advisor.service.transport.client import Response as Http1Response

if TYPE_CHECKING:
    from engine_advisor.service.proxy.state import ProxyState

log = logging.getLogger("engine_advisor.proxy")


class Relay(Reply):
    """One proxied request, from its decision's first upstream to the client's answer (the
    answer's progress: ``Reply``)."""

    __slots__ = ("req", "first", "headers", "own_lines", "task")

    def __init__(self, state: ProxyState, pools: Pools, req: ProxyRequest, decision: Decision,
                 first: Upstream, rid: bytes, prompt_tokens: int,
                 headers: list[tuple[bytes, bytes]]):
        """``rid``: the request id; ``headers``: the client's request headers."""
        self.state, self.pools, self.req, self.decision = state, pools, req, decision
        self.first, self.rid, self.prompt_tokens = first, rid, prompt_tokens
        self.headers = headers
        self.own_lines: bytes | None = None
        self.started = False
        self.finished = False     # the client's response is complete (streams: [DONE] sent)
        self.final: tuple[str, str, int] | None = None   # engine, upstream, status
        self.status_code = 500    # what the client was sent (500: nothing)
        self.phase = "first"

    async def run(self, writer: LaneWriter | AsgiWriter, task: asyncio.Task) -> None:
        """The attempts, in ``task`` (the request's); a client that goes away first cancels
        them: the upstream connection closes and the request counts as 499."""
        self.task, self.loop, self.writer = task, task.get_loop(), writer
        self.watch = watch = writer.watch(task)
        try:
            await self._attempts()
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            task.uncancel()               # our own cancel: the client left, upstream closed
            eng, name, _ = self.final or (self.first.engine, self.first.name, 0)
            self.state.metrics.count(eng, name, 499)
        finally:
            watch.close()                 # no await since the attempts ended: no cancel due

    async def _attempts(self) -> None:
        st, pools = self.state, self.pools
        cfg = pools.config
        loop = self.loop
        deadline = loop.time() + cfg.timeouts.total_s
        tried: list[Upstream] = []
        failures: list[tuple[Upstream, Failure]] = []
        up: Upstream | None = self.first
        engine_lock = None
        shared = False                        # two upstreams failed alike: the request's
        while up is not None:
            tried.append(up)
            failure = await self._attempt(up, deadline)
            if failure is None:
                if failures:                  # they failed where another one succeeded
                    count_deferred(failures)
                return
            if failure.reason in DEFERRED and any(
                    f.reason == failure.reason and f.status == failure.status
                    for _, f in failures):
                # the same failure from two upstreams: the request's own, not theirs; no
                # breaker counts it and no other upstream is tried
                failures.append((up, failure))
                shared = True
                st.metrics.request_failures.inc((failure.reason, str(failure.status)))
                break
            failures.append((up, failure))
            if not failure.retryable or len(tried) >= cfg.retries.max_attempts:
                break
            if engine_lock is None and not cfg.retries.other_engine:
                engine_lock = up.engine
            st.seq += 1
            nxt = pick(pools, self.decision, self.req.model, tried, engine_lock, st.seq)
            if nxt is None:
                break
            st.metrics.retries.inc((up.name, failure.reason))
            delay = self._backoff(len(tried) - 1, failure.retry_after)
            if loop.time() + delay >= deadline:
                break
            if delay > 0:
                await asyncio.sleep(delay)
            up = nxt
        if not shared:                        # no upstream did better: each one's failure
            count_deferred(failures)
        await fail(self, failures)

    def _backoff(self, n: int, after: float | None) -> float:
        r = self.pools.config.retries
        delay = min(r.backoff_max_s, r.backoff_base_s * (2 ** n)) * random.uniform(0.5, 1.0)
        if after is not None:
            delay = max(delay, min(after, r.backoff_max_s))
        return delay

    async def _attempt(self, up: Upstream, deadline: float) -> Failure | None:
        """One upstream's attempt; every failure of it mapped to a ``Failure`` (before the
        client got a byte) or an error event (after)."""
        st, t = self.state, self.pools.config.timeouts
        loop = self.loop
        up.in_flight += 1
        batch = up.in_flight
        probe = False if up.breaker.closed else up.breaker.acquire()   # closed: no probe
        resp: Http1Response | None = None
        self.phase = "first"
        try:
            sent_at = time.perf_counter()
            lines = self._lines(up)
            if not self.req.stream:
                answer_by = loop.time() + t.answer_s
                if answer_by >= deadline:
                    answer_by, self.phase = deadline, "total"
                dl = st.deadlines.at(answer_by, self.task).start()
                try:
                    status, headers, body = await up.fast.whole(
                        "POST", self.req.path, self.req.raw, t.connect_s, lines)
                except asyncio.CancelledError as exc:
                    dl.end()
                    if dl.timed_out():
                        raise TimeoutError from exc
                    raise
                finally:
                    dl.end()
                return await answer(self, up, status, headers, body, sent_at, batch)
            async with st.deadlines.at(min(loop.time() + t.first_byte_s, deadline),
                                       self.task) as cm:
                resp = await up.fast.request("POST", self.req.path, None, self.req.raw,
                                             t.connect_s, whole=False, lines=lines)
                if not 200 <= resp.status < 300:
                    cm.reschedule(deadline)
                    self.phase = "total"
                    body = await resp.read()
                    cm.reschedule(None)
                    return await answer(self, up, resp.status, resp.headers, body, sent_at,
                                        batch)
                return await stream(self, up, resp, cm, deadline, sent_at, batch)
        except TimeoutError:
            if self.phase == "grace":         # the client's stream is complete and counted
                st.metrics.fault(up.name, "unended")
                log.info("upstream %s did not end its response within %g s of [DONE] "
                         "(connection closed)", up.name, up.end_grace_s)
                return None
            up.breaker.failure()
            what = {"first": f"no first event within {t.first_byte_s:g} s" if self.req.stream
                    else f"no answer within {t.answer_s:g} s",
                    "idle": f"no event for {up.idle_s:g} s",
                    "total": f"not finished within {t.total_s:g} s"}[self.phase]
            return await self.failed_midway(up, Failure(
                "timeout", f"upstream {up.name} timed out: {what}", False, 504))
        except IdleTimeout as exc:            # an answer under way stalled (the reaper's)
            up.breaker.failure()
            st.metrics.fault(up.name, "idle")
            log.warning("upstream %s: %s (connection closed)", up.name, exc)
            return await self.failed_midway(up, Failure(
                "timeout", f"upstream {up.name} timed out: {exc}", False, 504))
        except (ConnectError, ConnectTimeout, PoolTimeout) as exc:
            up.breaker.failure()
            if isinstance(exc, ConnectError):
                mark_down(up, f"connect failed: {exc}")
                st.metrics.child(st.metrics.healthy, up.name).set(0)
            return Failure("connect", f"cannot connect to {up.name} ({type(exc).__name__}: "
                                      f"{exc})", True, 502)
        except OSError:
            if not self.started:
                raise
            return None     # the client went away while we wrote to it
        except UpstreamError as exc:
            if self.started:                  # mid-stream: the upstream's (before: _attempts')
                up.breaker.failure()
            log.warning("upstream %s: %s: %s (connection closed)", up.name,
                        type(exc).__name__, exc)
            return await self.failed_midway(up, Failure(
                "limit" if isinstance(exc, LimitError) else "read",
                f"upstream {up.name} failed: {type(exc).__name__}: {exc}", True, 502))
        finally:
            if probe:
                up.breaker.release()
            if resp is not None:
                resp.release()
            up.in_flight -= 1

    def _lines(self, up: Upstream) -> bytes:
        """The upstream request's header lines: the client's but ``DROP_REQUEST`` (built
        once per request), ``accept-encoding: identity``, the request id and the upstream's
        API key."""
        own = self.own_lines
        if own is None:
            parts = []
            for k, v in self.headers:
                if k not in DROP_REQUEST:
                    parts += (k, b": ", v, b"\r\n")
            own = self.own_lines = b"".join(parts)
        key = up.spec.api_key
        return b"".join((own, b"accept-encoding: identity\r\nx-request-id: ", self.rid,
                         b"\r\n" if key is None else b"\r\nauthorization: Bearer %b\r\n"
                         % key.get_secret_value().encode()))
