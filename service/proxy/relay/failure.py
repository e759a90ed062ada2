"""A failed attempt, and the error bodies a relay answers with."""

from __future__ import annotations

import json
from dataclasses import dataclass

from engine_advisor.service.errors import TYPES
from engine_advisor.service.proxy.upstreams import Upstream

# Failures before the response started that the request itself may cause (a 5xx answer, a
# connection cut or a response over the limits): counted against the upstream's breaker only
# once another upstream did better, and not at all when a second upstream fails the same way
# (engine_advisor.service.proxy.relay.attempts). Connect errors and timeouts count at once.
DEFERRED = frozenset({"status", "read", "limit"})


@dataclass
class Failure:
    reason: str                    # connect | timeout | read | limit | status | invalid
    message: str
    retryable: bool
    status: int = 502
    body: bytes | None = None      # the upstream's own error response, passed through
    headers: list[tuple[bytes, bytes]] | None = None
    retry_after: float | None = None


def error_bytes(status: int, message: str, type_: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_ or TYPES.get(
        status, "upstream_error"), "param": None, "code": status}}).encode()


def retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None            # an HTTP date: ignored (engines send seconds)


def count_deferred(failures: list[tuple[Upstream, Failure]]) -> None:
    """Count the ``DEFERRED`` ones against their upstreams' breakers."""
    for u, f in failures:
        if f.reason in DEFERRED:
            u.breaker.failure()
