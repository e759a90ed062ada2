"""The keep-alive timeouts of uvicorn's connections on one shared clock per event loop.

uvicorn arms a keep-alive timeout after every response (and cancels it when the next request
arrives). Here they are kept on ``KeepAliveClock`` (never early, up to a second late) instead
of an event-loop timer per response: under uvloop each such timer is a libuv handle, a few
microseconds per request.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable


class Alarm:
    """One keep-alive timeout (what uvicorn keeps as ``timeout_keep_alive_task``)."""

    __slots__ = ("clock", "when", "callback")

    def __init__(self, clock: KeepAliveClock, when: float, callback: Callable[[], None]):
        self.clock, self.when, self.callback = clock, when, callback

    def cancel(self) -> None:
        self.clock.alarms.pop(self, None)


class KeepAliveClock:
    """The keep-alive timeouts of one event loop's connections, checked every ``TICK``
    seconds while any is set."""

    TICK = 1.0
    _clocks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.alarms: dict[Alarm, None] = {}
        self.timer: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> KeepAliveClock:
        clock = cls._clocks.get(loop)
        if clock is None:
            clock = cls._clocks[loop] = cls(loop)
        return clock

    def call_later(self, delay: float, callback: Callable[[], None]) -> Alarm:
        alarm = Alarm(self, self.loop.time() + delay, callback)
        self.alarms[alarm] = None
        if self.timer is None:
            self.timer = self.loop.call_later(self.TICK, self._check)
        return alarm

    def _check(self) -> None:
        now = self.loop.time()
        for alarm in [a for a in self.alarms if a.when <= now]:
            if self.alarms.pop(alarm, 0) is None:      # not cancelled by an earlier callback
                alarm.callback()
        self.timer = self.loop.call_later(self.TICK, self._check) if self.alarms else None


class KeepAliveLoop:
    """The event loop as uvicorn's protocol uses it (``create_task``, ``call_later`` for
    the keep-alive timeout only): the loop's own ``create_task``, the shared clock's
    ``call_later``."""

    __slots__ = ("create_task", "call_later")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.create_task = loop.create_task
        self.call_later = KeepAliveClock.of(loop).call_later
