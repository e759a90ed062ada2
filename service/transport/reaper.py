"""The pool's timer: idle connections closed after keep-alive, stalled responses ended.

One timer per ``Http1Pool`` (engine_advisor.service.transport.client, which this module does not
import: ``ReapedPool`` is what the reaper reads and changes of it), armed while the pool has a
connection, every ``tick`` seconds (a quarter of the shorter of ``keepalive_s`` and ``idle_s``,
between 50 ms and 1 s). At each tick:

- an idle connection unused for ``keepalive_s``, or one the upstream closed or wrote to while
  idle, is closed and its slot given up, whether or not the pool is used again;
- a connection whose response has begun and then received no byte for ``idle_s`` (a body
  shorter than its ``Content-Length`` on a connection left open, a chunked body that stops)
  is closed, and its request fails with ``IdleTimeout``. A stream paused because its reader
  is slow is not idle.

So each fires at most one tick late, and a request pays nothing for it: the connection notes
the time its bytes arrive (engine_advisor.service.transport.connection), nothing more.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Protocol

from engine_advisor.service.transport.connection import Connection, IdleTimeout

MIN_TICK, MAX_TICK = 0.05, 1.0


class ReapedPool(Protocol):
    """What the reaper reads and changes of its pool (``Http1Pool``)."""

    keepalive_s: float
    idle_s: float | None
    idle: deque[Connection]       # replaced by the connections kept
    conns: set[Connection]

    def retire(self, c: Connection) -> None: ...


class Reaper:
    __slots__ = ("pool", "timer", "loop")

    def __init__(self, pool: ReapedPool):
        self.pool = pool
        self.timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def tick(self) -> float:
        p = self.pool
        shortest = p.keepalive_s if p.idle_s is None else min(p.keepalive_s, p.idle_s)
        return min(MAX_TICK, max(MIN_TICK, shortest / 4))

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Armed (if it is not) when the pool has made a connection."""
        if self.timer is None or self.loop is not loop:
            self.loop = loop
            self.timer = loop.call_later(self.tick(), self._run)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _run(self) -> None:
        self.timer = None
        pool = self.pool
        self.reap(time.monotonic())
        if pool.conns and self.loop is not None:
            self.timer = self.loop.call_later(self.tick(), self._run)

    def reap(self, now: float) -> None:
        pool = self.pool
        if pool.idle:
            keep: deque = deque()
            for c in pool.idle:
                if c.usable(now, pool.keepalive_s):
                    keep.append(c)
                else:
                    pool.retire(c)
            pool.idle = keep
        idle_s = pool.idle_s
        if idle_s is not None:
            for c in [c for c in pool.conns if c.stalled(now, idle_s)]:
                c.expire(IdleTimeout(f"no byte for {idle_s:g} s in the middle of the response"))
