"""The forwarding client's pool and the breaker's probe under cancellation, in-process against
small asyncio servers on loopback: no connection slot and no half-open probe is ever lost."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from prometheus_client import CollectorRegistry

from engine_advisor.service.proxy.breaker import HALF_OPEN, OPEN
from engine_advisor.service.proxy.decision import Decision
from engine_advisor.service.proxy.relay.attempts import Relay
from engine_advisor.service.proxy.relay.writer import AsgiWriter
from engine_advisor.service.proxy.request import COMPLETIONS, parse
from engine_advisor.service.proxy.state import ProxyState
from engine_advisor.service.settings import Settings
from engine_advisor.service.transport.client import (
    DONE,
    Connection,
    Http1Pool,
    LimitError,
    Limits,
    PoolTimeout,
)

pytestmark = pytest.mark.timeout(60)

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
BODY = json.dumps({"model": "m", "prompt": "hi", "max_tokens": 1}).encode()


async def serve(answer):
    """A loopback server calling ``answer(writer)`` once per request head; (server, url)."""
    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = [int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                     if ln.lower().startswith(b"content-length:")]
                await reader.readexactly(n[0] if n else 0)
                if await answer(writer) == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def ok(writer):
    writer.write(OK)


async def hang(writer):
    await asyncio.sleep(3600)


async def send(pool: Http1Pool, timeout: float = 2.0):
    return await pool.request("POST", "/v1/completions", [], BODY, timeout)


def test_a_connection_handed_to_a_cancelled_waiter_goes_back_to_the_pool():
    async def main():
        server, url = await serve(ok)
        pool = Http1Pool(url, 1)
        first = await send(pool)
        assert await first.read() == b"{}"
        waiter = asyncio.ensure_future(send(pool))
        await asyncio.sleep(0.05)                # the waiter queues for the one slot
        assert len(pool.waiters) == 1
        first.release()                          # the connection is handed to the waiter...
        waiter.cancel()                          # ...which is cancelled before it resumes
        with pytest.raises(asyncio.CancelledError):
            await waiter
        again = await send(pool, timeout=1.0)    # not PoolTimeout: the slot came back
        assert await again.read() == b"{}"
        again.release()
        assert pool.open == 1 and len(pool.idle) == 1
        server.close()
    asyncio.run(main())


def test_a_slot_passed_to_a_cancelled_waiter_is_passed_on():
    async def main():
        server, url = await serve(ok)
        pool = Http1Pool(url, 1)
        first = await send(pool)
        waiter = asyncio.ensure_future(send(pool))
        await asyncio.sleep(0.05)
        first.release()          # body unread: the connection closes, its slot passes on
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert pool.open == 0
        again = await send(pool, timeout=1.0)
        assert await again.read() == b"{}"
        again.release()
        server.close()
    asyncio.run(main())


def test_cancelled_and_timed_out_requests_free_their_slot():
    async def main():
        server, url = await serve(hang)
        pool = Http1Pool(url, 1)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await send(pool)
        assert pool.open == 0
        task = asyncio.ensure_future(send(pool))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.open == 0 and not pool.waiters
        server.close()
    asyncio.run(main())


def test_a_waiter_times_out_with_pool_timeout_and_leaves_no_trace():
    async def main():
        server, url = await serve(hang)
        pool = Http1Pool(url, 1)
        busy = asyncio.ensure_future(send(pool))
        await asyncio.sleep(0.05)
        with pytest.raises(PoolTimeout):
            await send(pool, timeout=0.1)
        assert not pool.waiters and pool.open == 1
        busy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await busy
        assert pool.open == 0
        server.close()
    asyncio.run(main())


def test_content_length_over_the_limit_is_refused_before_the_body_is_read():
    big = b"HTTP/1.1 200 OK\r\ncontent-length: 999999999\r\n\r\n"

    async def answer(writer):
        writer.write(big)

    async def main():
        server, url = await serve(answer)
        pool = Http1Pool(url, 1, Limits(body_bytes=4096))
        with pytest.raises(LimitError, match="Content-Length 999999999"):
            await send(pool)
        assert pool.open == 0
        server.close()
    asyncio.run(main())


# ------------------------------------------------------------------ the breaker's probe
def proxy_state(tmp_path, url: str, **timeouts) -> ProxyState:
    doc = {"pools": {"vllm": [{"url": url, "model": "m"}]},
           "workload": {"kv_bytes_per_token": 70272, "gpu": "B300", "num_gpus": 8},
           "breaker": {"failure_threshold": 1, "open_s": 0},
           "retries": {"max_attempts": 1},
           "timeouts": {"connect_s": 1.0, **timeouts}}
    path = tmp_path / "upstreams.yaml"
    path.write_text(yaml.safe_dump(doc))
    return ProxyState(Settings(_env_file=None, upstreams=path), CollectorRegistry())


async def call(st: ProxyState, body: bytes, receive, sent: list):
    pools = st.pools
    up = pools.upstreams[0]
    decision = Decision((up.group,), {}, "none", 1, 1, 1, "v")
    scope = {"type": "http", "method": "POST", "path": COMPLETIONS, "headers": []}

    async def send_(message):
        sent.append(message)

    await Relay(st, pools, parse(body, COMPLETIONS), decision, up, b"rid", 1, scope["headers"]).run(
        AsgiWriter(receive, send_), asyncio.current_task())


def half_open(st: ProxyState):
    up = st.pools.upstreams[0]
    up.breaker.trip()                       # open_s 0: half-open at the next look
    assert up.breaker.state == HALF_OPEN and up.breaker.available()
    return up


def test_the_probe_is_released_when_the_client_goes_away(tmp_path):
    async def main():
        server, url = await serve(hang)
        st = proxy_state(tmp_path, url)
        await st.load("test")
        up = half_open(st)
        gone = asyncio.Event()

        async def receive():
            await asyncio.sleep(0.2)
            gone.set()
            return {"type": "http.disconnect"}

        await call(st, BODY, receive, [])
        assert gone.is_set()
        assert not up.breaker.probing and up.breaker.available()   # the next request probes
        await st.stop()
        server.close()
    asyncio.run(main())


def test_the_probe_is_released_on_a_timeout_and_on_a_client_write_error(tmp_path):
    async def main():
        server, url = await serve(hang)
        st = proxy_state(tmp_path, url, total_s=0.2)
        await st.load("test")
        up = half_open(st)

        async def receive():
            await asyncio.sleep(3600)

        sent: list = []
        await call(st, BODY, receive, sent)
        assert sent[0]["status"] == 504
        assert up.breaker.state == OPEN or up.breaker.state == HALF_OPEN   # failed: re-opened
        assert not up.breaker.probing
        await st.stop()
        server.close()

        event = b'data: {"a": 1}\n\n'
        stream = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                  b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n" % (len(event), event))

        async def streaming(writer):
            writer.write(stream)
            await asyncio.sleep(3600)

        server, url = await serve(streaming)
        st = proxy_state(tmp_path, url)
        await st.load("test")
        up = half_open(st)

        async def broken_client(message):
            raise OSError("client socket gone")

        pools = st.pools
        decision = Decision((up.group,), {}, "none", 1, 1, 1, "v")
        scope = {"type": "http", "method": "POST", "path": COMPLETIONS, "headers": []}
        body = json.dumps({"model": "m", "prompt": "hi", "stream": True}).encode()
        with pytest.raises(OSError):
            relay = Relay(st, pools, parse(body, COMPLETIONS), decision, up, b"rid", 1,
                          scope["headers"])
            await relay.run(AsgiWriter(receive, broken_client), asyncio.current_task())
        assert not up.breaker.probing and up.breaker.available()
        assert up.fast.open == 0                     # the upstream connection was closed
        await st.stop()
        server.close()
    asyncio.run(main())


# ------------------------------------------------------------------ parsing, split anywhere
class FakeTransport:
    def __init__(self):
        self.aborted = self.paused = False

    def write(self, data):
        pass

    def abort(self):
        self.aborted = True

    def pause_reading(self):
        self.paused = True

    def resume_reading(self):
        self.paused = False

    def get_extra_info(self, name):
        return None


def feed(pieces: list[bytes], limits: Limits | None = None) -> Connection:
    c = Connection(limits or Limits())
    c.connection_made(FakeTransport())
    c.send(b"request", None)
    for p in pieces:
        c.data_received(p)
    return c


def test_a_chunked_response_split_anywhere_decodes_the_same():
    resp = (b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n")
    for cut in range(1, len(resp)):
        c = feed([resp[:cut], resp[cut:]])
        assert c.error is None and c.phase == DONE, cut
        assert c.status == 200 and c.headers == [(b"transfer-encoding", b"chunked")]
        assert c.take() == b"helloabc" and c.reusable() and not c.transport.aborted


def test_refusals_close_the_connection():
    head = b"HTTP/1.1 200 OK\r\n"
    for bad, why in ((head + b"content-length: 1\r\ncontent-length: 1\r\n\r\nx", "Duplicate"),
                     (head + b"transfer-encoding: gzip\r\n\r\n", "Transfer-Encoding"),
                     (head + b"x: " + b"a" * 70_000, "header section"),
                     (b"HTTP/1.1 099 Odd\r\ncontent-length: 0\r\n\r\n", "invalid status")):
        c = feed([bad])
        assert c.error is not None and why in str(c.error), (bad[:60], c.error)
        assert c.transport.aborted and not c.reusable()
    c = feed([head + b"content-length: 2\r\n\r\nok" + head])       # a second response begins
    assert c.phase == DONE and c.extra and not c.reusable()
    c = feed([head + b"transfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n"
              + b"x-t: " + b"v" * 3000 + b"\r\n\r\n"], Limits(trailer_bytes=1024))
    assert isinstance(c.error, LimitError)


def test_large_bodies_are_read_whole_and_slow_streams_pause_the_upstream():
    big = b"x" * (3 << 20)
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(big)

    async def answer(writer):
        writer.write(head + big)

    async def main():
        server, url = await serve(answer)
        pool = Http1Pool(url, 1, Limits(body_bytes=4 << 20))
        r = await send(pool)                       # read whole: never paused
        assert await asyncio.wait_for(r.read(), 10) == big
        r.release()
        r = await pool.request("POST", "/", [], BODY, 2.0, whole=False)
        await asyncio.sleep(0.3)                   # nobody reads: the upstream is paused
        conn = r._conn
        assert conn.paused and conn.buffered < len(big)
        got = b"".join([piece async for piece in r.body()])
        assert got == big and not conn.paused
        r.release()
        assert len(pool.idle) == 1
        server.close()
    asyncio.run(main())


# ------------------------------------------------------------------ whose failure it is
ERROR_500 = (b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
             b"content-length: 2\r\n\r\n{}")


async def fail(writer):
    writer.write(ERROR_500)


def two_upstreams(tmp_path, a: str, b: str) -> ProxyState:
    doc = {"pools": {"vllm": [{"url": a, "model": "m"}, {"url": b, "model": "m"}]},
           "workload": {"kv_bytes_per_token": 70272, "gpu": "B300", "num_gpus": 8},
           "breaker": {"failure_threshold": 100, "max_open_percent": 100},
           "retries": {"max_attempts": 3, "backoff_base_s": 0, "backoff_max_s": 0},
           "timeouts": {"connect_s": 1.0}}
    path = tmp_path / "upstreams.yaml"
    path.write_text(yaml.safe_dump(doc))
    return ProxyState(Settings(_env_file=None, upstreams=path), CollectorRegistry())


@pytest.mark.parametrize("second, want_status, want_failures", [
    (ok, 200, [1, 0]),       # only the first failed: its failure, counted
    (fail, 500, [0, 0]),     # both failed alike: the request's failure, counted by neither
])
def test_a_failure_two_upstreams_share_is_the_requests_own(tmp_path, second, want_status,
                                                           want_failures):
    async def main():
        s1, u1 = await serve(fail)
        s2, u2 = await serve(second)
        st = two_upstreams(tmp_path, u1, u2)
        await st.load("test")
        first, other = st.pools.upstreams
        decision = Decision((first.group,), {}, "none", 1, 1, 1, "v")
        scope = {"type": "http", "method": "POST", "path": COMPLETIONS, "headers": []}
        sent: list = []

        async def send_(message):
            sent.append(message)

        async def receive():
            await asyncio.sleep(3600)

        relay = Relay(st, st.pools, parse(BODY, COMPLETIONS), decision, first, b"rid", 1,
                      scope["headers"])
        await relay.run(AsgiWriter(receive, send_), asyncio.current_task())
        assert sent[0]["status"] == want_status
        assert [first.breaker.failures, other.breaker.failures] == want_failures
        shared = st.metrics.request_failures.get(("status", "500"))
        assert shared == (1 if want_status == 500 else 0)
        await st.stop()
        s1.close()
        s2.close()
    asyncio.run(main())
