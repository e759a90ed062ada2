"""Which headers cross the proxy: the client's go upstream but the hop-by-hop and credential
ones (``DROP_REQUEST``); of the upstream's answer only ``PASS_RESPONSE`` reach the client."""

from __future__ import annotations

from engine_advisor.service.transport.headers import check_value

DROP_REQUEST = {b"host", b"content-length", b"connection", b"keep-alive", b"te", b"trailer",
                b"transfer-encoding", b"upgrade", b"proxy-authorization", b"proxy-connection",
                b"authorization", b"accept-encoding", b"x-request-id", b"expect"}
PASS_RESPONSE = {b"content-type", b"cache-control", b"retry-after"}


def passed(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k in PASS_RESPONSE]


def passed_lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The ``PASS_RESPONSE`` ones of an upstream's response headers as header lines, each
    value checked (engine_advisor.service.transport.headers)."""
    out = b""
    for k, v in headers:
        if k in PASS_RESPONSE:
            check_value(k, v)
            out += b"".join((k, b": ", v, b"\r\n"))
    return out
