"""A per-upstream circuit breaker: closed -> open after consecutive failures -> half-open.

- closed: requests pass; ``failure_threshold`` consecutive failures open it.
- open: no requests for ``open_s`` seconds.
- half-open (after ``open_s``): one probe request at a time; its success closes the breaker,
  its failure opens it again for another ``open_s``; a probe that ends with neither (the
  request cancelled, the client gone) is released, so the next request probes.

``acquire()`` tells the caller whether its request is the probe; the caller calls
``release()`` for it when the attempt ends, whatever the outcome (a ``finally``).

A panic threshold, as Envoy's: a closed breaker opens only if ``may_open()`` allows it (the proxy
allows it while at most ``max_open_percent`` of the upstream's pool, the upstreams serving the same
model, would be open, and never for the pool's last closed one: engine_advisor.service.proxy.state),
so that no run of failures takes a whole pool out. Refused, it stays closed with its failures
counted; the next failure asks again.

The state advances lazily on each look (no timer task); ``on_change`` is told of every change
(the proxy metrics export it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"
STATE_VALUES = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}


class CircuitBreaker:
    def __init__(self, failure_threshold: int = 5, open_s: float = 10.0, *,
                 clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[str], None] | None = None):
        if failure_threshold < 1 or open_s < 0:
            raise ValueError("failure_threshold must be >= 1 and open_s >= 0")
        self.failure_threshold = failure_threshold
        self.open_s = open_s
        self.clock = clock
        self.on_change = on_change
        self.may_open: Callable[[], bool] | None = None     # the panic threshold (above)
        self.failures = 0
        self.opened_at = 0.0
        self.probing = False
        self._state = CLOSED
        self.closed = True          # _state is CLOSED (read on every request, so a field)

    def _set(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self.closed = state == CLOSED
            if self.on_change is not None:
                self.on_change(state)

    @property
    def state(self) -> str:
        if self._state == OPEN and self.clock() >= self.opened_at + self.open_s:
            self.probing = False
            self._set(HALF_OPEN)
        return self._state

    def available(self) -> bool:
        """Whether a request may go to this upstream now."""
        s = self.state
        return s == CLOSED or (s == HALF_OPEN and not self.probing)

    def acquire(self) -> bool:
        """A request is sent: in half-open it is the one probe (True)."""
        if self.closed:
            return False
        if self.state == HALF_OPEN and not self.probing:
            self.probing = True
            return True
        return False

    def release(self) -> None:
        """The probe's attempt ended (every outcome, also cancellation): no probe in flight."""
        self.probing = False

    def success(self) -> None:
        self.failures = 0
        self.probing = False
        if self._state != CLOSED:
            self._set(CLOSED)

    def failure(self) -> None:
        self.failures += 1
        if self.state == HALF_OPEN:
            self.trip()                 # the probe failed: open again (it was open already)
        elif self.failures >= self.failure_threshold and (
                self._state == OPEN or self.may_open is None or self.may_open()):
            self.trip()

    def trip(self) -> None:
        self.opened_at = self.clock()
        self.probing = False
        self._set(OPEN)
