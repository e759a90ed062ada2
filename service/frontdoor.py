"""The front door's limits: what one connection and one request head may hold, how long they may
take, how many connections one process keeps (engine_advisor.service.transport.protocol applies
them).

Defaults are those of the gateways the service sits next to: Envoy's 60 KiB of request headers
(``max_request_headers_kb``) and 100 header fields (``max_headers_count``), nginx's 60 s for a
request head (``client_header_timeout``) and for a body (``client_body_timeout``; here the whole
body, not each read, so a client trickling a byte a second is cut off too).

Each refusal is a response in the error envelope with ``connection: close``; the connection
is then half-closed and what the client still sends is read and dropped for up to
``LINGER_S`` (so that the client reads the answer instead of a reset), then it is closed.
At most ``lingering_max`` refused connections linger at once (a quarter of the connection
cap, at least 16); past that one is closed as soon as its answer is written, so that a flood
of connections cannot take the open files the cap leaves.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Callable
from dataclasses import dataclass, field

LINGER_S = 2.0                  # a refused connection is read (and dropped) this long at most
FD_RESERVE = 128                # open files kept for everything but client connections
REASONS = {408: "request_timeout", 431: "request_too_large", 501: "not_implemented",
           503: "service_unavailable"}
PHRASES = {408: b"Request Timeout", 431: b"Request Header Fields Too Large",
           501: b"Not Implemented", 503: b"Service Unavailable"}


def default_max_connections() -> int:
    """Half of the process's open-file limit less ``FD_RESERVE``: a proxied request holds an
    upstream connection too, and past the limit the process could not even accept a
    connection to refuse it."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, (soft - FD_RESERVE) // 2)


@dataclass
class FrontDoor:
    header_bytes: int = 60 << 10        # request line and header lines of one request
    header_fields: int = 100
    header_timeout_s: float = 60.0      # a head, from its first byte (or the connection's)
    body_timeout_s: float = 60.0        # a body, from the end of its head
    max_connections: int | None = None  # per process; None: no cap
    on_refusal: Callable[[str], None] | None = None   # told each refusal's reason (metrics)
    lingering: int = field(default=0, compare=False)   # refused connections lingering now

    @property
    def lingering_max(self) -> int:
        return max(16, (self.max_connections or 1024) // 4)

    @classmethod
    def of(cls, settings, on_refusal: Callable[[str], None] | None = None) -> FrontDoor:
        cap = settings.max_connections
        return cls(header_bytes=settings.max_header_bytes,
                   header_fields=settings.max_header_fields,
                   header_timeout_s=settings.header_timeout_s,
                   body_timeout_s=settings.body_timeout_s,
                   max_connections=default_max_connections() if cap is None else cap,
                   on_refusal=on_refusal)

    def refused(self, reason: str) -> None:
        if self.on_refusal is not None:
            self.on_refusal(reason)


def refusal(status: int, message: str, param: str | None = None,
            extra: bytes = b"") -> bytes:
    """A whole response closing the connection: the error envelope with ``status``."""
    body = json.dumps({"error": {"message": message, "type": REASONS[status], "param": param,
                                 "code": status}}).encode()
    return b"".join((b"HTTP/1.1 %d %b\r\n" % (status, PHRASES[status]),
                     b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body),
                     extra, b"connection: close\r\n\r\n", body))
