"""Request timeouts on one shared clock: ``asyncio.timeout_at`` semantics, coarser and cheaper.

``asyncio.timeout_at`` arms an event-loop timer per use and cancels it on exit (under uvloop a
libuv timer handle each time): about 7 µs per request, more than the rest of a timeout's
bookkeeping, and a stream re-arms it on every event. Here the deadlines of the requests in
flight sit in one dict, and one timer checks them every ``TICK`` seconds while any is set: a
deadline fires up to ``TICK`` late, never early. Entering, leaving and ``reschedule`` are dict
updates.

On expiry the task is cancelled and ``TimeoutError`` raised from the ``async with`` block, as
``asyncio.timeout_at`` does (a cancellation from elsewhere still propagates as such).
"""

from __future__ import annotations

import asyncio
from types import TracebackType

TICK = 0.05


class Deadline:
    """One ``async with`` block under a deadline (a loop-clock time, or None: no deadline)."""

    __slots__ = ("clock", "when", "task", "expired", "cancelling")

    def __init__(self, clock: Deadlines, when: float | None, task: asyncio.Task | None = None):
        self.clock, self.when = clock, when
        self.task = task              # the current task, when the caller knows it
        self.expired = False
        self.cancelling = 0

    async def __aenter__(self) -> Deadline:
        return self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.end()
        if exc_type is asyncio.CancelledError and self.timed_out():
            raise TimeoutError from exc       # our cancel, and no other one came meanwhile
        return None

    # the same without ``async with`` (no coroutine per enter and exit): ``start()``, then
    # ``end()`` on every way out, and on CancelledError ``timed_out()`` says whether it was
    # this deadline's cancel (then raise TimeoutError instead)
    def start(self) -> Deadline:
        task = self.task or asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadline should be used inside a task")
        self.task, self.cancelling = task, task.cancelling()
        if self.when is not None:
            self.clock.add(self)
        return self

    def end(self) -> None:
        self.clock.active.pop(self, None)

    def timed_out(self) -> bool:
        """After ``end()``, for a CancelledError: whether it was this deadline's (the
        cancel is then taken back)."""
        return self.expired and self.task.uncancel() <= self.cancelling

    def reschedule(self, when: float | None) -> None:
        """A new deadline (None: none) for the rest of the block."""
        if self.expired:
            return
        self.when = when
        if when is None:
            self.clock.active.pop(self, None)
        else:
            self.clock.add(self)


class Deadlines:
    """The clock of one event loop's proxied requests (bound to the loop of its first use)."""

    def __init__(self, tick: float = TICK):
        self.tick = tick
        self.active: dict[Deadline, None] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.timer: asyncio.TimerHandle | None = None

    def at(self, when: float | None, task: asyncio.Task | None = None) -> Deadline:
        """A deadline for an ``async with`` block of ``task`` (default: the current one)."""
        return Deadline(self, when, task)

    def add(self, d: Deadline) -> None:
        loop = d.task.get_loop()
        if loop is not self.loop:              # first use, or another loop (tests)
            self.loop, self.active, self.timer = loop, {}, None
        self.active[d] = None
        if self.timer is None:
            self.timer = loop.call_at(loop.time() + self.tick, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self.loop:
            return
        now = loop.time()
        for d in [d for d in self.active if d.when <= now]:
            del self.active[d]
            d.expired = True
            d.task.cancel()
        self.timer = loop.call_at(now + self.tick, self._check, loop) if self.active else None
