"""Fault injection: random failures, header-forced errors, dropped streams, hangs, CUDA OOM.

- ``--fail-rate R``: each generation request fails with probability R, with 429, 500 or 503
  (drawn from the seeded generator, so a run is reproducible).
- ``X-Return-Error: STATUS`` (400-599): the request fails at once with that status.
- ``X-Drop-After: N``: the connection is cut after N generated tokens (no ``[DONE]``).
- ``X-Hang: 1``: the server never answers (until the client goes away).
- memory fraction >= ``--oom-threshold``: each request fails with probability ``--oom-rate``
  with HTTP 500 'CUDA out of memory' (or the process fails at startup with ``--oom-on-startup``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

RANDOM_STATUSES = (429, 500, 503)
MESSAGES = {
    400: "Bad request (injected by X-Return-Error)",
    429: "The server is busy: too many requests are queued, try again later",
    500: "Internal server error while processing the request",
    503: "The engine is temporarily unavailable",
}


def oom_message(gpu_memory_bytes: float, fraction: float) -> str:
    gib = 1024**3
    total = gpu_memory_bytes / gib
    free = max(total * (1.0 - fraction) * 0.25, 0.01)
    return (f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            f"{total:.2f} GiB of which {free:.2f} GiB is free. Of the allocated memory "
            f"{total * fraction:.2f} GiB is allocated by PyTorch. Lower --gpu-memory-utilization"
            f" / --mem-fraction-static to leave room for activations and CUDA graphs.")


@dataclass(frozen=True)
class Injected:
    status: int
    message: str


class HeaderError(ValueError):
    """A fault-injection header with an invalid value; the message names it."""


def _int_header(headers: Mapping[str, str], name: str, lo: int, hi: int) -> int | None:
    raw = headers.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise HeaderError(f"header {name}: expected an integer, got {raw!r}") from None
    if not lo <= value <= hi:
        raise HeaderError(f"header {name}: {value} is outside {lo} .. {hi}")
    return value


class FaultInjector:
    def __init__(self, *, fail_rate: float = 0.0, oom_active: bool = False, oom_rate: float = 0.0,
                 oom_text: str = "", seed: int = 0):
        self.fail_rate = fail_rate
        self.oom_active = oom_active
        self.oom_rate = oom_rate
        self.oom_text = oom_text
        self._rng = random.Random(f"faults/{seed}")

    def forced(self, headers: Mapping[str, str]) -> Injected | None:
        """The error an ``X-Return-Error`` header asks for."""
        status = _int_header(headers, "X-Return-Error", 400, 599)
        if status is None:
            return None
        default = f"Error {status} (injected by X-Return-Error)"
        return Injected(status, MESSAGES.get(status, default))

    @staticmethod
    def drop_after(headers: Mapping[str, str]) -> int | None:
        return _int_header(headers, "X-Drop-After", 0, 1 << 30)

    @staticmethod
    def hang(headers: Mapping[str, str]) -> bool:
        raw = headers.get("x-hang")
        return raw is not None and raw.strip().lower() not in ("", "0", "false", "no")

    def random_failure(self) -> Injected | None:
        """A --fail-rate failure or a CUDA OOM (memory fraction at/above the threshold)."""
        if self.fail_rate > 0 and self._rng.random() < self.fail_rate:
            status = self._rng.choice(RANDOM_STATUSES)
            return Injected(status, MESSAGES[status])
        if self.oom_active and self.oom_rate > 0 and self._rng.random() < self.oom_rate:
            return Injected(500, self.oom_text)
        return None
