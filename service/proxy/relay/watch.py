"""Hearing that the client has gone: either watch cancels the relay's task when it does."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.types import Receive

if TYPE_CHECKING:
    from engine_advisor.service.transport.cycle import LaneCycle


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
    """``DisconnectWatch`` for a request of uvicorn's direct lane
    (engine_advisor.service.transport): the cycle calls back when its client disconnects, so nothing
    is stepped or waited on."""

    __slots__ = ("cycle", "task", "gone", "closed")

    def __init__(self, cycle: LaneCycle, task: asyncio.Task):
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
