"""The proxy's hot-path pieces in-process: uvicorn's protocol writing head and body at once
(service/server.py), the client-disconnect watch without a task and the shared-clock timeouts
(service/proxy/forward.py, service/proxy/deadlines.py)."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from service.proxy.deadlines import Deadlines
from service.proxy.forward import DisconnectWatch
from service.server import ServerProtocol


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


async def exchange(app, request: bytes, steps: int = 10) -> Recorder:
    config = Config(app=app, lifespan="off", proxy_headers=False, log_level="warning")
    config.load()
    p = ServerProtocol(config, ServerState(), {}, _loop=asyncio.get_running_loop())
    t = Recorder()
    p.connection_made(t)
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
