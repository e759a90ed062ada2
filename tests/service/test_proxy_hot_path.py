"""The proxy's hot-path pieces in-process: uvicorn's protocol writing head and body at once
(service/transport/protocol.py), the client-disconnect watch without a task and the shared-clock
timeouts (service/proxy/relay/watch.py, service/proxy/deadlines.py)."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from engine_advisor.service.proxy.deadlines import Deadlines
from engine_advisor.service.proxy.relay.watch import DisconnectWatch
from engine_advisor.service.transport.keepalive import KeepAliveClock
from engine_advisor.service.transport.protocol import HttpProtocol


def run(test):
    """An async test run by asyncio.run (no async plugin here)."""
    @functools.wraps(test)
    def sync(*args, **kwargs):
        asyncio.run(test(*args, **kwargs))
    return sync


# ----------------------------------------------------------------------------- the protocol
class Recorder(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data):
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name,
                                                                                     default)

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


def connect(app) -> tuple[HttpProtocol, Recorder]:
    """Our protocol on a recording transport, connected."""
    config = Config(app=app, lifespan="off", proxy_headers=False, log_level="warning",
                    access_log=False)
    config.load()
    p = HttpProtocol(config, ServerState(), {}, _loop=asyncio.get_running_loop())
    t = Recorder()
    p.connection_made(t)
    return p, t


async def exchange(app, request: bytes, steps: int = 10) -> Recorder:
    p, t = connect(app)
    p.data_received(request)
    for _ in range(steps):
        await asyncio.sleep(0)
    return t


def respond(*bodies: bytes, delay: float = 0.0, length: bool = True):
    async def app(scope, receive, send):
        await receive()
        headers = [(b"content-length", str(sum(map(len, bodies))).encode())] if length else []
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i, b in enumerate(bodies):
            if delay:
                await asyncio.sleep(delay)
            await send({"type": "http.response.body", "body": b,
                        "more_body": i < len(bodies) - 1})
    return app


GET = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"


@run
async def test_head_and_body_leave_in_one_write():
    t = await exchange(respond(b"hello"), GET)
    assert t.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"]
    # keep-alive: the next request on the connection is coalesced too
    t = await exchange(respond(b"a", b"b"), GET + GET)
    assert t.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\na", b"b"] * 2


@run
async def test_a_head_without_a_body_yet_is_written_in_the_same_loop_iteration():
    t = await exchange(respond(b"data: 1\n\n", delay=0.05, length=False), GET, steps=3)
    assert len(t.writes) == 1 and t.writes[0].endswith(b"transfer-encoding: chunked\r\n\r\n")
    await asyncio.sleep(0.1)
    assert t.writes[1:] == [b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"]


@run
async def test_head_requests_100_continue_and_close_keep_their_order():
    t = await exchange(respond(b"hello"), b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n")
    assert t.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"]
    t = await exchange(respond(b"ok"), b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
                                       b"content-length: 2\r\n\r\nhi")
    assert t.writes[0] == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert t.writes[1:] == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"]
    t = await exchange(respond(b"bye"), b"GET / HTTP/1.0\r\n\r\n")      # closed after
    assert t.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nbye"]
    assert t.closed


# ----------------------------------------------------------------------------- the direct lane
class LaneApp:
    """An app with an ``entrance``, as engine_advisor.service.main.App: the lane's requests go
    there."""

    def __init__(self, entrance):
        self.entrance = entrance
        self.seen: list[str] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        self.seen.append(scope["path"])
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"slow"})


def post(path: bytes = b"/v1/completions", body: bytes = b'{"a":1}', extra: bytes = b"",
         version: bytes = b"1.1") -> bytes:
    return (b"POST " + path + b" HTTP/" + version + b"\r\nhost: x\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def lane(direct_app):
    app = LaneApp(direct_app)
    calls: list[dict] = []

    async def direct(scope, receive, send):
        calls.append(scope)
        assert scope["app"] is app
        await direct_app(scope, receive, send)

    app.entrance = direct
    return app, calls


async def echo(scope, receive, send):
    message = await receive()
    body = message["body"]
    while message.get("more_body"):
        message = await receive()
        body += message["body"]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode()),
                            (b"x-path", scope["path"].encode())]})
    await send({"type": "http.response.body", "body": body})


@run
async def test_the_completion_routes_take_the_direct_lane_and_write_once():
    app, calls = lane(echo)
    t = await exchange(app, post() + post(b"/v1/chat/completions", b"{}") + post(b"/v1/route")
                       + b"GET /v1/completions HTTP/1.1\r\nhost: x\r\n\r\n"
                       + post(b"/v1/completions?x=1"))
    assert [c["path"] for c in calls] == ["/v1/completions", "/v1/chat/completions"]
    assert app.seen == ["/v1/route", "/v1/completions", "/v1/completions"]   # other paths
    assert t.writes[0] == (b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nx-path: /v1/completions"
                           b"\r\n\r\n{\"a\":1}")
    assert t.writes[1].endswith(b"x-path: /v1/chat/completions\r\n\r\n{}")
    assert len(t.writes) == 5 and not t.closed          # one write each, in order, kept alive
    scope = calls[0]
    assert scope["method"] == "POST" and scope["query_string"] == b"" and \
        scope["raw_path"] == b"/v1/completions" and (b"content-length", b"7") in scope["headers"]


@run
async def test_the_lane_frames_streams_http10_and_chunked_request_bodies():
    async def stream(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    app, _ = lane(stream)
    t = await exchange(app, post(), steps=3)
    assert t.writes == [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                        b"transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n"]
    await asyncio.sleep(0.05)
    assert t.writes[1:] == [b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"]
    app, _ = lane(echo)
    t = await exchange(app, post(version=b"1.0"))
    assert t.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nx-path: /v1/completions"
                        b"\r\nconnection: close\r\n\r\n{\"a\":1}"] and t.closed
    chunked = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
               b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    t = await exchange(app, chunked)
    assert t.writes[0].endswith(b"\r\n\r\nabcde")


@run
async def test_the_lane_refuses_bad_headers_and_unfinished_responses_like_uvicorn():
    async def bad(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"x-a", b"ok\r\nset-cookie: evil")]})

    app, _ = lane(bad)
    t = await exchange(app, post())
    assert t.writes[0].startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b"evil" not in b"".join(t.writes) and t.closed

    async def short(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"10")]})
        await send({"type": "http.response.body", "body": b"abc", "more_body": True})

    app, _ = lane(short)
    t = await exchange(app, post())
    assert t.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"] and t.closed


@run
async def test_a_client_gone_mid_request_is_seen_by_receive():
    seen = []

    async def waits(scope, receive, send):
        await receive()                          # the body
        seen.append(await receive())             # then: the disconnect

    app, _ = lane(waits)
    p, t = connect(app)
    p.data_received(post())
    await asyncio.sleep(0.01)
    p.connection_lost(None)
    await asyncio.sleep(0.01)
    assert seen == [{"type": "http.disconnect"}]


@run
async def test_an_idle_connection_is_closed_after_the_keep_alive_timeout_never_before():
    KeepAliveClock.TICK, tick = 0.02, KeepAliveClock.TICK
    try:
        config = Config(app=respond(b"hi"), lifespan="off", proxy_headers=False,
                        log_level="warning", access_log=False, timeout_keep_alive=0.2)
        config.load()
        p = HttpProtocol(config, ServerState(), {}, _loop=asyncio.get_running_loop())
        t = Recorder()
        p.connection_made(t)
        p.data_received(GET)
        await asyncio.sleep(0.15)
        assert len(t.writes) == 1 and not t.closed
        p.data_received(GET)               # a new request: the timeout starts again
        await asyncio.sleep(0.15)
        assert len(t.writes) == 2 and not t.closed
        await asyncio.sleep(0.2)
        assert t.closed
    finally:
        KeepAliveClock.TICK = tick


# ----------------------------------------------------------------------------- the watch
class FakeReceive:
    """uvicorn's receive after the body: waits on an event, then says disconnect."""

    def __init__(self, bare_yield: bool = False):
        self.event = asyncio.Event()
        self.calls = 0
        self.bare_yield = bare_yield

    async def __call__(self):
        self.calls += 1
        if self.bare_yield:
            await asyncio.sleep(0)
        await self.event.wait()
        return {"type": "http.disconnect"}


@pytest.mark.parametrize("bare_yield", [False, True])
@run
async def test_the_watch_cancels_the_request_when_the_client_leaves(bare_yield):
    receive = FakeReceive(bare_yield)
    gone = []

    async def request():
        watch = DisconnectWatch(receive, asyncio.current_task())
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            gone.append(watch.gone)
            raise
        finally:
            watch.close()

    task = asyncio.ensure_future(request())
    await asyncio.sleep(0.01)
    receive.event.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert gone == [True] and not receive.event._waiters


@run
async def test_a_closed_watch_never_cancels_and_leaves_no_waiter():
    receive = FakeReceive()
    watch = DisconnectWatch(receive, asyncio.current_task())
    assert len(receive.event._waiters) == 1
    watch.close()
    assert not receive.event._waiters
    receive.event.set()                 # set after close: nothing happens
    await asyncio.sleep(0.01)
    assert not watch.gone
    # closed after the event was set but before its callbacks ran
    receive = FakeReceive()
    watch = DisconnectWatch(receive, asyncio.current_task())
    receive.event.set()
    watch.close()
    await asyncio.sleep(0.01)
    assert not watch.gone


@run
async def test_a_receive_that_fails_or_waits_on_something_else_is_handled():
    async def failing():
        raise RuntimeError("receive broke")

    watch = DisconnectWatch(failing, asyncio.current_task())
    assert watch.closed and not watch.gone

    class Odd:                              # yields what a Task would refuse
        def __await__(self):
            yield "something"
            return {"type": "http.disconnect"}

    async def odd():
        return await Odd()

    watch = DisconnectWatch(odd, asyncio.current_task())
    assert watch.closed and not watch.gone


# ----------------------------------------------------------------------------- deadlines
@run
async def test_a_deadline_fires_late_never_early_and_raises_timeout():
    clock = Deadlines(tick=0.02)
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        async with clock.at(loop.time() + 0.1):
            await asyncio.sleep(5)
    took = time.monotonic() - t0
    assert 0.1 <= took < 0.1 + 0.5
    assert not clock.active
    assert asyncio.current_task().cancelling() == 0


@run
async def test_reschedule_moves_or_removes_the_deadline():
    clock = Deadlines(tick=0.01)
    loop = asyncio.get_running_loop()
    async with clock.at(loop.time() + 0.05) as cm:
        cm.reschedule(None)
        await asyncio.sleep(0.1)           # no deadline now
        cm.reschedule(loop.time() + 1.0)
        await asyncio.sleep(0.05)
    with pytest.raises(TimeoutError):
        async with clock.at(loop.time() + 5) as cm:
            cm.reschedule(loop.time() + 0.03)
            await asyncio.sleep(5)
    async with clock.at(None):             # no deadline at all
        await asyncio.sleep(0.03)
    assert not clock.active


@run
async def test_another_cancellation_stays_a_cancellation():
    clock = Deadlines(tick=0.01)
    loop = asyncio.get_running_loop()

    async def guarded():
        async with clock.at(loop.time() + 5):
            await asyncio.sleep(5)

    task = asyncio.ensure_future(guarded())
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not clock.active


# ----------------------------------------------------------------------------- the lane's own entry
class OnCycle:
    """An entrance with a ``lane`` (as engine_advisor.service.proxy.entrance.Entrance): it gets the
    request cycle itself."""

    def __init__(self, answer):
        self.answer = answer
        self.cycles: list = []

    async def lane(self, cycle):
        self.cycles.append(cycle)
        await self.answer(cycle)

    async def __call__(self, scope, receive, send):          # not used on the lane
        raise AssertionError("the lane calls lane(), not the ASGI entry")


@run
async def test_a_lane_entry_gets_the_whole_body_and_writes_a_response_in_one_write():
    async def answer(cycle):
        body = await cycle.gather_body(1 << 20)
        assert isinstance(body, bytes) and len(cycle.body) == 0         # handed over whole
        cycle.respond(200, b"content-type: text/plain\r\ncontent-length: %d\r\n" % len(body),
                      bytes(body))

    direct = OnCycle(answer)
    app = LaneApp(direct)
    p, t = connect(app)
    p.server_state.default_headers = [(b"date", b"Mon, 30 Nov 2026 12:00:00 GMT")]
    p.data_received(post() + post(body=b'{"b":22}'))
    for _ in range(10):
        await asyncio.sleep(0)
    assert t.writes == [
        b"HTTP/1.1 200 OK\r\ndate: Mon, 30 Nov 2026 12:00:00 GMT\r\ncontent-type: text/plain\r\n"
        b"content-length: 7\r\n\r\n{\"a\":1}",
        b"HTTP/1.1 200 OK\r\ndate: Mon, 30 Nov 2026 12:00:00 GMT\r\ncontent-type: text/plain\r\n"
        b"content-length: 8\r\n\r\n{\"b\":22}"]
    assert not t.closed and [c.task is not None for c in direct.cycles] == [True, True]
    with pytest.raises(RuntimeError):                        # one response per request
        direct.cycles[0].respond(200, b"content-length: 0\r\n", b"")

    t = await exchange(LaneApp(direct), post(version=b"1.0"))      # closed after
    assert t.writes[0].endswith(b"content-length: 7\r\nconnection: close\r\n\r\n{\"a\":1}")
    assert t.closed

    async def no_content(cycle):
        cycle.respond(204, b"content-length: 0\r\n", b"ignored")

    t = await exchange(LaneApp(OnCycle(no_content)), post())
    assert t.writes == [b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n"]


@run
async def test_a_lane_entry_hears_of_a_disconnect_once_and_writes_nothing_after_it():
    calls: list[str] = []
    gone = asyncio.Event()

    async def answer(cycle):
        await cycle.gather_body(1 << 20)
        cycle.on_disconnect = lambda: calls.append("gone") or gone.set()
        await gone.wait()
        cycle.respond(200, b"content-length: 2\r\n", b"hi")     # too late: dropped

    app = LaneApp(OnCycle(answer))
    p, t = connect(app)
    p.data_received(post())
    await asyncio.sleep(0.01)
    p.connection_lost(None)
    p.connection_lost(None)
    await asyncio.sleep(0.01)
    assert calls == ["gone"] and t.writes == []


@run
async def test_a_lane_body_that_arrives_in_pieces_is_gathered_in_one_buffer_within_its_cap():
    from engine_advisor.service.transport.cycle import OverCap

    got: list = []

    async def answer(cycle):
        try:
            got.append(await cycle.gather_body(300_000))
        except OverCap as exc:
            got.append(exc.size)
        cycle.respond(200, b"content-length: 0\r\n", b"")

    for size, expect in ((250_000, "body"), (400_000, "over")):
        got.clear()
        body = b'{"p":"' + b"x" * (size - 8) + b'"}'
        p, t = connect(LaneApp(OnCycle(answer)))
        request = post(body=body)
        for i in range(0, len(request), 65_536):        # reads of 64 KiB, the loop between
            p.data_received(request[i:i + 65_536])
            for _ in range(3):
                await asyncio.sleep(0)
        for _ in range(10):
            await asyncio.sleep(0)
        if expect == "body":
            assert got == [bytearray(body)]
        else:                    # refused once past the cap, before the rest was held
            assert len(got) == 1 and 300_000 < got[0] < 300_000 + 2 * 65_536
        assert t.writes and t.writes[0].startswith(b"HTTP/1.1 200 OK")
