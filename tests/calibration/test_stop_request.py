"""Ctrl-C during a sweep is never lost (calibration.sweep.driver.StopRequest): the cases in which
``asyncio.run``'s own SIGINT handler dropped it."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from calibration.sweep.driver import StopRequest


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
