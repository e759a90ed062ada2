"""Ctrl-C during a sweep is never lost and never breaks asyncio
(engine_advisor.calibration.sweep.stop.StopRequest): the cases in which ``asyncio.run``'s own
SIGINT handler dropped it, and the ones in which a ``KeyboardInterrupt`` raised inside an event
loop's construction left a half-built loop behind."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import warnings

import pytest

from engine_advisor.calibration.sweep.stop import StopRequest


def test_a_signal_as_the_batch_finishes_still_stops():
    stop = StopRequest()

    async def batch():
        stop.handler(signal.SIGINT, None)   # lands while the batch's task is completing
        return "samples"

    with pytest.raises(KeyboardInterrupt):
        stop.run_batch(batch)


def test_a_cancellation_absorbed_by_the_batch_still_stops():
    stop = StopRequest()

    async def batch():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(5)
        except asyncio.CancelledError:     # e.g. a stream's clean-up that swallows it
            pass
        return "samples"

    previous = signal.signal(signal.SIGINT, stop.handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            stop.run_batch(batch)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_signal_during_a_write_waits_for_the_write():
    stop = StopRequest()
    written = []
    with pytest.raises(KeyboardInterrupt):
        with stop.writing():
            stop.handler(signal.SIGINT, None)
            written.append("row")
    assert written == ["row"]


def test_outside_a_batch_or_write_it_raises_at_once():
    stop = StopRequest()
    with pytest.raises(KeyboardInterrupt):
        stop.handler(signal.SIGINT, None)
    assert stop.requested


def test_no_request_returns_the_batch_result():
    stop = StopRequest()

    async def batch():
        return 42

    assert stop.run_batch(batch) == 42
    with stop.writing():
        pass


class _SignalledPolicy(asyncio.DefaultEventLoopPolicy):
    """Delivers a real SIGINT while ``asyncio.run`` builds its loop (``when="build"``) or
    while it closes it (``when="close"``)."""

    def __init__(self, when: str) -> None:
        super().__init__()
        self.when = when

    def new_event_loop(self):
        if self.when == "build":
            os.kill(os.getpid(), signal.SIGINT)   # handled at the next bytecode: mid-build
        loop = super().new_event_loop()
        if self.when == "close":
            close = loop.close

            def signalled_close():
                os.kill(os.getpid(), signal.SIGINT)
                close()
            loop.close = signalled_close
        return loop


@pytest.mark.parametrize("when", ["build", "close"])
def test_a_signal_while_the_loop_is_built_or_closed_stops_cleanly(when):
    stop = StopRequest()
    ran = []

    async def batch():
        ran.append(True)
        return "samples"

    previous = signal.signal(signal.SIGINT, stop.handler)
    old_policy = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(_SignalledPolicy(when))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(KeyboardInterrupt):
                stop.run_batch(batch)
            gc.collect()                          # a half-built loop would complain here
    finally:
        asyncio.set_event_loop_policy(old_policy)
        signal.signal(signal.SIGINT, previous)
    assert stop.requested
    assert ran == ([] if when == "build" else [True])   # a batch asked to stop never starts
    assert not [w for w in caught if "never awaited" in str(w.message)]


def test_a_stop_asked_before_a_batch_never_starts_it():
    stop = StopRequest()
    stop.requested = True
    ran = []

    async def batch():
        ran.append(True)

    with pytest.raises(KeyboardInterrupt):
        stop.run_batch(batch)
    assert ran == []
