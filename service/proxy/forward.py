"""Forwarding one request: attempts over upstreams, streaming, timeouts, disconnects.

``ProxyCall`` is the ASGI response a proxy route returns. It runs the attempts in a task and
watches the client meanwhile: a client that goes away cancels the task, which closes the
upstream connection, so the engine aborts the request (streaming or not).

- The request body goes upstream byte for byte; so does the answer. A streamed answer is
  forwarded event by event (whole ``data: ...\\n\\n`` events, as they arrive, never re-split
  or re-encoded), so a failure can never leave half an event at the client.
- Nothing reaches the client before the upstream's first complete event (streaming) or whole
  body (non-streaming). Until then a connect error, a 429 or 5xx, a connection cut, or a
  response the client refuses (service.proxy.http1: malformed, ambiguous or over
  ``limits``; logged) is retried on another upstream (the chosen engine's first, then,
  with ``retries.other_engine``, the other engine's) after a jittered backoff that honours
  ``Retry-After``. After that, a failure ends the stream with an error event
  ``data: {"error": {...}}``. A single event longer than ``limits.event_bytes`` is refused
  like a malformed response.
- Breakers no client can trip for everyone: a 5xx, a cut or a response over the limits
  (``DEFERRED``) counts against the upstream's breaker only once another upstream has done
  better (or none could be tried); when a second upstream fails the same request the same
  way, it is the request's failure: answered as it is, retried no further, counted against
  no breaker (``engine_advisor_proxy_request_failures_total``). Connect errors and timeouts
  count at once.
- Timeouts: ``connect_s`` (TCP connect), ``first_byte_s`` (streaming: until the first event),
  ``answer_s`` (non-streaming: the whole answer, which an engine sends once it has generated
  it), ``idle_s`` (streaming: between events), ``total_s`` (the whole request). A timeout
  answers 504 (or an error event mid-stream) and is not retried. They are checked on one
  shared clock (service.proxy.deadlines): never early, up to 50 ms late.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from service.errors import TYPES
from service.proxy.decide import Decision
from service.proxy.health_checker import mark_down
from service.proxy.http1 import (
    ConnectError,
    ConnectTimeout,
    LimitError,
    PoolTimeout,
    UpstreamError,
)
from service.proxy.http1 import Response as Http1Response
from service.proxy.observations import Observation
from service.proxy.request import ProxyRequest
from service.proxy.upstreams import Pools, Upstream

if TYPE_CHECKING:
    from service.proxy.state import ProxyState
    from service.server import DirectCycle

log = logging.getLogger("engine_advisor.proxy")

DROP_REQUEST = {b"host", b"content-length", b"connection", b"keep-alive", b"te", b"trailer",
                b"transfer-encoding", b"upgrade", b"proxy-authorization", b"proxy-connection",
                b"authorization", b"accept-encoding", b"x-request-id", b"expect"}
PASS_RESPONSE = {b"content-type", b"cache-control", b"retry-after"}


class UsageField:
    """A usage count in a response body: the number of its last ``"name": N``.

    ``findall(data)[-1]`` of the pattern, found by ``rfind`` of the quoted name rather than
    the regex engine's scan of every position. Matches cannot overlap (after the opening
    quote only spaces, a colon and digits), so the last one starts at the last occurrence of
    the name that the pattern matches at."""

    __slots__ = ("key", "pattern")

    def __init__(self, name: bytes):
        self.key = b'"%b"' % name
        self.pattern = re.compile(re.escape(self.key) + rb"\s*:\s*(\d+)")

    def last(self, data: bytes) -> int | None:
        key, match = self.key, self.pattern.match
        i = data.rfind(key)
        while i >= 0:
            m = match(data, i)
            if m is not None:
                return int(m.group(1))
            i = data.rfind(key, 0, i)
        return None


COMPLETION = UsageField(b"completion_tokens")
PROMPT = UsageField(b"prompt_tokens")
DONE = b"data: [DONE]"
BAD_NAME = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")
BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_row = tuple.__new__            # Observation._make without its length check (fields are fixed)
# Failures before the response started that the request itself may cause (a 5xx answer, a
# connection cut or a response over the limits): counted against the upstream's breaker only
# once another upstream did better, and not at all when a second upstream fails the same way
# (service.proxy.forward.ProxyCall._run). Connect errors and timeouts count at once.
DEFERRED = frozenset({"status", "read", "limit"})


@dataclass
class Failure:
    reason: str                    # connect | timeout | read | limit | status
    message: str
    retryable: bool
    status: int = 502
    body: bytes | None = None      # the upstream's own error response, passed through
    headers: list[tuple[bytes, bytes]] | None = None
    retry_after: float | None = None


def error_bytes(status: int, message: str, type_: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_ or TYPES.get(
        status, "upstream_error"), "param": None, "code": status}}).encode()


def retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None            # an HTTP date: ignored (engines send seconds)


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


def header_lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    """``name: value\r\n`` lines; a name or value that could split or end the head
    (anything but an RFC 9110 token as a name, a control character but HTAB in a value)
    raises ``ValueError``."""
    out = b""
    for k, v in headers:
        if BAD_NAME.search(k) or BAD_VALUE.search(v) or not k:
            raise ValueError(f"invalid response header {k[:40]!r}")
        out += b"%b: %b\r\n" % (k, v)
    return out


def passed_lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    """``header_lines`` of the ``PASS_RESPONSE`` ones of an upstream's response headers."""
    out = b""
    for k, v in headers:
        if k in PASS_RESPONSE:
            if BAD_VALUE.search(v):
                raise ValueError(f"invalid response header {k[:40]!r}")
            out += b"".join((k, b": ", v, b"\r\n"))
    return out


def count_deferred(failures: list[tuple[Upstream, Failure]]) -> None:
    """Count the ``DEFERRED`` ones against their upstreams' breakers."""
    for u, f in failures:
        if f.reason in DEFERRED:
            u.breaker.failure()


def pick(pools: Pools, decision: Decision, model: str | None, tried: list[Upstream],
         engine: str | None, seq: int) -> Upstream | None:
    """The available upstream with the fewest requests in flight, of the best-ranked group
    that has one; with ``engine`` set, that engine's groups first (then no others)."""
    now = time.monotonic()
    groups = decision.ranked
    if engine is not None:
        groups = tuple(g for g in groups if g[0] == engine)
    for g in groups:
        best: Upstream | None = None
        for u in pools.groups.get(g, ()):
            if u in tried or (model is not None and u.spec.model != model) \
                    or not u.available(now):
                continue
            if best is None or u.in_flight < best.in_flight or (
                    u.in_flight == best.in_flight and u.picked < best.picked):
                best = u
        if best is not None:
            best.picked = seq
            return best
    return None


class DisconnectWatch:
    """Cancels ``task`` when ``receive()`` says the client has disconnected.

    One ``receive()`` coroutine is stepped by hand from the done-callbacks of the futures it
    waits on, as a Task would step it: a Task per request for this (created, scheduled, then
    cancelled and unwound) costs more CPU than the rest of the watching. A receive that fails
    (or yields what a Task would refuse) ends the watching."""

    __slots__ = ("receive", "task", "coro", "waiting", "gone", "closed")

    def __init__(self, receive: Receive, task: asyncio.Task):
        self.receive, self.task = receive, task
        self.gone = self.closed = False
        self.waiting: asyncio.Future | None = None
        self.coro = receive()
        self._step()

    def _step(self, _: object = None) -> None:
        while not self.closed:
            self.waiting = None
            try:
                waits_on = self.coro.send(None)
            except StopIteration as stop:
                if stop.value["type"] == "http.disconnect":
                    self.closed = self.gone = True
                    self.task.cancel()
                    return
                self.coro = self.receive()        # more request body: not ours, go on
                continue
            except Exception:                     # a receive that fails: nothing to watch
                self.closed = True
                return
            if waits_on is None:                  # a bare yield (sleep(0)): step again soon
                asyncio.get_running_loop().call_soon(self._step)
            elif hasattr(waits_on, "add_done_callback"):
                self.waiting = waits_on
                waits_on.add_done_callback(self._step)
            else:
                self.close()
            return

    def close(self) -> None:
        """The response is done (or failed): stop watching."""
        if self.closed:
            return
        self.closed = True
        if self.waiting is not None:
            self.waiting.remove_done_callback(self._step)
        self.coro.close()


class CycleWatch:
    """``DisconnectWatch`` for a request of uvicorn's direct lane (service.server): the
    cycle calls back when its client disconnects, so nothing is stepped or waited on."""

    __slots__ = ("cycle", "task", "gone", "closed")

    def __init__(self, cycle: DirectCycle, task: asyncio.Task):
        self.cycle, self.task = cycle, task
        self.gone = self.closed = False
        if cycle.disconnected:
            self._fire()
        else:
            cycle.on_disconnect = self._fire

    def _fire(self) -> None:
        if not self.closed:
            self.closed = self.gone = True
            self.task.cancel()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.cycle.on_disconnect = None


class ProxyCall(Response):
    """The ASGI response of one proxied request (see the module docstring)."""

    __slots__ = ("state", "pools", "req", "decision", "first", "request_id", "prompt_tokens",
                 "rid", "own_lines", "started", "finished", "final", "status_code", "watch",
                 "cycle", "background", "task", "loop", "phase")

    def __init__(self, state: ProxyState, pools: Pools, req: ProxyRequest, decision: Decision,
                 first: Upstream, request_id: str, prompt_tokens: int):
        self.state, self.pools, self.req, self.decision = state, pools, req, decision
        self.first, self.request_id, self.prompt_tokens = first, request_id, prompt_tokens
        self.rid = request_id.encode()
        self.own_lines: bytes | None = None
        self.started = False
        self.finished = False     # the client's response is complete (streams: [DONE] sent)
        self.final: tuple[str, str, int] | None = None   # engine, upstream, status
        self.status_code = 500    # what the client was sent (500: nothing)
        self.watch: DisconnectWatch | CycleWatch | None = None
        self.cycle: DirectCycle | None = None
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The attempts run in this task; the watch cancels it if the client goes away first.
        self.task = task = asyncio.current_task()
        self.loop = task.get_loop()
        await self._watched(scope, send, DisconnectWatch(receive, task))

    async def on_cycle(self, cycle: DirectCycle, task: asyncio.Task) -> None:
        """The same on a cycle of uvicorn's direct lane, in its ``task``: whole responses
        (every non-streaming one, every error before a stream starts) are written as
        bytes."""
        self.task = task
        self.loop = cycle.loop
        self.cycle = cycle
        self.watch = watch = CycleWatch(cycle, task)
        try:
            await self._run(cycle.scope, cycle.send)
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            task.uncancel()
            eng, name, _ = self.final or (self.first.engine, self.first.name, 0)
            self.state.metrics.count(eng, name, 499)
        finally:
            watch.close()

    async def _watched(self, scope: Scope, send: Send, watch: DisconnectWatch | CycleWatch
                       ) -> None:
        task = self.task
        self.watch = watch
        try:
            await self._run(scope, send)
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            task.uncancel()               # our own cancel: the client left, upstream closed
            eng, name, _ = self.final or (self.first.engine, self.first.name, 0)
            self.state.metrics.count(eng, name, 499)
        finally:
            watch.close()                 # no await since _run ended: no cancel can be due

    async def _start(self, send: Send, status: int, headers: list[tuple[bytes, bytes]],
                     whole: bool = False) -> None:
        """``whole``: the body follows in one message; nothing is left to cancel, so the
        watch ends first (the response's end then wakes nobody)."""
        if whole:
            self.watch.close()
        headers.append((b"x-request-id", self.request_id.encode()))
        self.status_code = status
        await send({"type": "http.response.start", "status": status, "headers": headers})

    # ---------------------------------------------------------------- attempts
    async def _run(self, scope: Scope, send: Send) -> None:
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
            failure = await self._attempt(scope, send, up, deadline)
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
        await self._fail(send, failures)

    def _backoff(self, n: int, after: float | None) -> float:
        r = self.pools.config.retries
        delay = min(r.backoff_max_s, r.backoff_base_s * (2 ** n)) * random.uniform(0.5, 1.0)
        if after is not None:
            delay = max(delay, min(after, r.backoff_max_s))
        return delay

    async def _fail(self, send: Send, failures: list[tuple[Upstream, Failure]]) -> None:
        up, last = failures[-1]
        if last.body is not None:               # the upstream's own answer, as it came
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
            headers = [(b"content-type", b"application/json")]
        self.final = (up.engine, up.name, status)
        self.state.metrics.count(up.engine, up.name, status)
        await self._whole(send, status, headers, up, body)

    async def _whole(self, send: Send, status: int, headers: list[tuple[bytes, bytes]],
                     up: Upstream, body: bytes) -> None:
        """A whole response: ``headers`` (the upstream's passed ones, or ours), then the
        upstream's name, the length and the request id."""
        cycle = self.cycle
        if cycle is None:
            headers += self._ours(up)
            headers.append((b"content-length", b"%d" % len(body)))
            await self._start(send, status, headers, whole=True)
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()
        self._respond(cycle, status, header_lines(headers), up, body)

    def _respond(self, cycle: DirectCycle, status: int, lines: bytes, up: Upstream,
                 body: bytes) -> None:
        """``_whole`` on a direct-lane cycle (``lines``: checked header lines)."""
        self.watch.close()
        self.status_code = status
        cycle.respond(status, b"".join((lines, up.lines, b"content-length: %d\r\nx-request-id: "
                                        % len(body), self.rid, b"\r\n")), body)

    @staticmethod
    def _ours(up: Upstream) -> list[tuple[bytes, bytes]]:
        return [(b"x-engine-advisor-engine", up.engine.encode()),
                (b"x-engine-advisor-upstream", up.name.encode())]

    @staticmethod
    def _response_headers(resp: Http1Response, up: Upstream) -> list[tuple[bytes, bytes]]:
        out = [(k, v) for k, v in resp.headers if k in PASS_RESPONSE]
        out.append((b"x-engine-advisor-engine", up.engine.encode()))
        out.append((b"x-engine-advisor-upstream", up.name.encode()))
        return out

    async def _attempt(self, scope: Scope, send: Send, up: Upstream,
                       deadline: float) -> Failure | None:
        st, t = self.state, self.pools.config.timeouts
        loop = self.loop
        up.in_flight += 1
        batch = up.in_flight
        probe = False if up.breaker.closed else up.breaker.acquire()   # closed: no probe
        resp: Http1Response | None = None
        self.phase = "first"
        try:
            sent_at = time.perf_counter()
            lines = self._lines(scope, up)
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
                return await self._answer(send, up, status, headers, body, sent_at, batch)
            async with st.deadlines.at(min(loop.time() + t.first_byte_s, deadline),
                                       self.task) as cm:
                resp = await up.fast.request("POST", self.req.path, None, self.req.raw,
                                             t.connect_s, whole=False, lines=lines)
                if not 200 <= resp.status < 300:
                    cm.reschedule(deadline)
                    self.phase = "total"
                    body = await resp.read()
                    cm.reschedule(None)
                    return await self._answer(send, up, resp.status, resp.headers, body,
                                              sent_at, batch)
                return await self._stream(send, up, resp, cm, deadline, sent_at, batch)
        except TimeoutError:
            up.breaker.failure()
            what = {"first": f"no first event within {t.first_byte_s:g} s" if self.req.stream
                    else f"no answer within {t.answer_s:g} s",
                    "idle": f"no event for {t.idle_s:g} s",
                    "total": f"not finished within {t.total_s:g} s"}[self.phase]
            return await self._failed_midway(send, up, Failure(
                "timeout", f"upstream {up.name} timed out: {what}", False, 504))
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
            if self.started:                  # mid-stream: the upstream's (before: _run's)
                up.breaker.failure()
            log.warning("upstream %s: %s: %s (connection closed)", up.name,
                        type(exc).__name__, exc)
            return await self._failed_midway(send, up, Failure(
                "limit" if isinstance(exc, LimitError) else "read",
                f"upstream {up.name} failed: {type(exc).__name__}: {exc}", True, 502))
        finally:
            if probe:
                up.breaker.release()
            if resp is not None:
                resp.release()
            up.in_flight -= 1

    def _lines(self, scope: Scope, up: Upstream) -> bytes:
        """The upstream request's header lines: the client's but ``DROP_REQUEST`` (built
        once per request), ``accept-encoding: identity``, the request id and the upstream's
        API key."""
        own = self.own_lines
        if own is None:
            parts = []
            for k, v in scope["headers"]:
                if k not in DROP_REQUEST:
                    parts += (k, b": ", v, b"\r\n")
            own = self.own_lines = b"".join(parts)
        key = up.spec.api_key
        return b"".join((own, b"accept-encoding: identity\r\nx-request-id: ", self.rid,
                         b"\r\n" if key is None else b"\r\nauthorization: Bearer %b\r\n"
                         % key.get_secret_value().encode()))

    async def _failed_midway(self, send: Send, up: Upstream, f: Failure) -> Failure | None:
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
            await send({"type": "http.response.body", "body": err, "more_body": False})
        except OSError:
            pass
        return None

    async def _answer(self, send: Send, up: Upstream, status: int,
                      headers: list[tuple[bytes, bytes]], body: bytes, sent_at: float,
                      batch: int) -> Failure | None:
        """A whole answer of the upstream (``headers``: its response headers)."""
        if status == 429 or status >= 500:
            if status == 429:                 # a 5xx is counted by _run (DEFERRED)
                up.breaker.success()
            ra = next((v for k, v in headers if k == b"retry-after"), None)
            after = retry_after(ra.decode("latin-1") if ra else None)
            if after:
                up.not_before = time.monotonic() + min(
                    after, self.pools.config.retries.backoff_max_s * 10)
            return Failure("status", f"upstream {up.name} answered {status}", True, status,
                           body, [(k, v) for k, v in headers if k in PASS_RESPONSE], after)
        br = up.breaker
        if not br.closed or br.failures or br.probing:    # else success() changes nothing
            br.success()
        self.started = True
        self.final = (up.engine, up.name, status)
        cycle = self.cycle
        if cycle is not None and not cycle.flow.write_paused:
            self._respond(cycle, status, passed_lines(headers), up, body)
        else:
            await self._whole(send, status, [(k, v) for k, v in headers if k in PASS_RESPONSE],
                              up, body)
        self.state.metrics.count(up.engine, up.name, status)
        if 200 <= status < 300:
            total = time.perf_counter() - sent_at
            n = COMPLETION.last(body)
            if n is not None:
                self._observe(up, body, n, None, total, batch)
        return None

    async def _stream(self, send: Send, up: Upstream, resp: Http1Response, cm,
                      deadline: float, sent_at: float, batch: int) -> Failure | None:
        t = self.pools.config.timeouts
        loop = self.loop
        pending = b""
        last = b""
        ttft = None
        events = skipped = 0
        ended = False
        chunks = resp.body()
        cap = self.pools.config.limits.event_bytes
        async for chunk in chunks:
            buf = pending + chunk if pending else chunk
            end = event_end(buf)
            if len(buf) - end > cap:            # the event under way, not yet ended
                raise LimitError(f"an event over {cap} bytes")
            if end == 0:
                pending = buf
                continue
            out, pending = (buf, b"") if end == len(buf) else (buf[:end], buf[end:])
            cm.reschedule(None)
            if not self.started:
                ttft = time.perf_counter() - sent_at
                headers = self._response_headers(resp, up)
                if not any(k == b"content-type" for k, _ in headers):
                    headers.append((b"content-type", b"text/event-stream"))
                headers.append((b"x-accel-buffering", b"no"))
                await self._start(send, resp.status, headers)
                self.started = True
                self.final = (up.engine, up.name, resp.status)
            # [DONE] ends the client's stream in the same write (the upstream's chunked
            # terminator is still read below, so its connection can be reused)
            ended = ends_with_done(out)
            await send({"type": "http.response.body", "body": out, "more_body": not ended})
            events += out.count(b"\n\n") or out.count(b"\r\n\r\n")
            skipped += out.count(b'"choices":[]') + out.count(b'"content":""') \
                + out.count(DONE)
            last = out
            if ended:
                break
            self.phase = "idle" if loop.time() + t.idle_s < deadline else "total"
            cm.reschedule(min(loop.time() + t.idle_s, deadline))
        if ended:
            self.finished, pending = True, b""
            self.phase = "total"
            cm.reschedule(deadline)
            try:                   # the chunked terminator, so the connection is reused
                async for _ in chunks:
                    pass
            except UpstreamError:
                pass               # not reused: release() closes it
        cm.reschedule(None)
        if pending:   # an unterminated last event: pass it on as it came
            if not self.started:
                return Failure("read", f"upstream {up.name} sent no complete event", True, 502)
            await send({"type": "http.response.body", "body": pending, "more_body": True})
            last = pending
        if not self.started:
            return Failure("read", f"upstream {up.name} ended the stream without an event",
                           True, 502)
        if not ends_with_done(last):
            up.breaker.failure()
            return await self._failed_midway(send, up, Failure(
                "read", f"upstream {up.name} ended the stream before [DONE]", False, 502))
        up.breaker.success()
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        self.state.metrics.count(up.engine, up.name, resp.status)
        total = time.perf_counter() - sent_at
        n = COMPLETION.last(last)
        if n is None:
            n = max(events - skipped, 0)
        if n > 0:
            self._observe(up, last, n, ttft, total, batch)
        return None

    def _observe(self, up: Upstream, tail: bytes, n: int, ttft: float | None, total: float,
                 batch: int) -> None:
        st, pools = self.state, self.pools
        prompt = PROMPT.last(tail)
        if prompt is None:
            prompt = self.prompt_tokens
        tpot = (total - ttft) / (n - 1) if ttft is not None and n > 1 else None
        if ttft is not None:
            st.metrics.child(st.metrics.ttft, up.engine).observe(ttft)
        if tpot is not None:
            st.metrics.child(st.metrics.tpot, up.engine).observe(tpot)
            pred = self.decision.predictions.get(up.group)
            if pred is not None and pred.tpot_s > 0:
                st.metrics.child(st.metrics.tpot_ratio, up.engine).observe(tpot / pred.tpot_s)
        head, tail_ = up.observed
        if head is None or up.observed_of != pools.generation:   # per upstream and pools file
            w = pools.config.workload
            head = (up.engine, up.name, pools.gpu_name, w.num_gpus, up.spec.dcp_size,
                    up.spec.mem_fraction, pools.kv_bytes_per_token, pools.kv_shards)
            tail_ = (w.preset or "", w.kv_cache_dtype)
            up.observed, up.observed_of = (head, tail_), pools.generation
        st.observations.add(_row(Observation, (*head, prompt if prompt > 1 else 1, n, batch,
                                               ttft, tpot, total, *tail_)))

