"""How a sweep stops before its end: ``SweepAbort`` when it cannot go on (recorded before it is
raised), and Ctrl-C and SIGTERM (``StopRequest``): a stop asked for is never lost, and never raised
inside asyncio's machinery or in the middle of writing a point.

Every event loop of a sweep (engine_advisor.calibration.sweep.driver) runs through
``StopRequest.run_batch``; every point is written under ``StopRequest.writing``.
"""
from __future__ import annotations

import asyncio
import contextlib

from engine_advisor.calibration.errors import CalibrationError


class SweepAbort(CalibrationError, RuntimeError):
    """Stop the sweep (e.g. the engine cannot be reached); recorded before raising."""


class StopRequest:
    """Ctrl-C and SIGTERM for a sweep, never lost and never raised inside asyncio's machinery.

    Installed as the SIGINT/SIGTERM handler (so ``asyncio.run`` does not add its own), it
    records the request first. While an event loop runs a batch it cancels the batch's task
    (the point is not recorded); while a loop is being built or torn down around it (no task
    to cancel yet, or any more) it only records, and ``run_batch`` raises once the loop is
    closed: a ``KeyboardInterrupt`` raised inside the loop's constructor left a half-built
    loop behind (a traceback from its ``__del__``, a coroutine never awaited). While a point
    is being written (``writing``) the raise waits for the write to end. Anywhere else it
    raises ``KeyboardInterrupt`` at once. ``check`` raises after a batch or a write when a
    stop was asked for meanwhile.
    """

    def __init__(self) -> None:
        self.requested = False
        self._cancel = None          # cancels the running batch (set inside asyncio.run)
        self._writing = 0
        self._in_loop = 0            # inside asyncio.run: never raise there

    def handler(self, signum, frame) -> None:  # noqa: ARG002
        self.requested = True
        if self._cancel is not None:
            self._cancel()
        elif not (self._writing or self._in_loop):
            raise KeyboardInterrupt

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt

    def run_batch(self, coro_fn):
        """``asyncio.run`` of ``coro_fn()`` with this handler able to cancel it; every event
        loop of a sweep runs through here."""
        async def main():
            loop, task = asyncio.get_running_loop(), asyncio.current_task()
            self._cancel = lambda: loop.call_soon_threadsafe(task.cancel)
            try:
                if self.requested:   # asked while the loop was being built
                    raise asyncio.CancelledError
                return await coro_fn()
            finally:
                self._cancel = None
        self.check()
        self._in_loop += 1
        try:
            result = asyncio.run(main())
        except asyncio.CancelledError:
            if self.requested:
                raise KeyboardInterrupt from None
            raise
        finally:
            self._in_loop -= 1
        self.check()                 # asked during the batch but absorbed: the point is dropped
        return result

    @contextlib.contextmanager
    def writing(self):
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        self.check()
