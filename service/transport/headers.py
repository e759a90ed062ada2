"""HTTP/1.1 response heads as bytes: status lines, and header lines checked so that nothing a
handler or an upstream sends can split or end the head.

A name must be an RFC 9110 token; a value may hold no control character but HTAB (no CR or
LF). Every writer of a head to a client (engine_advisor.service.transport.cycle, the relay's whole
responses) checks through this module.
"""

from __future__ import annotations

import http
import re

BAD_NAME = re.compile(rb"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")
BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
NO_BODY = frozenset({204, 304})


def status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


STATUS_LINES = {s: status_line(s) for s in range(100, 600)}
GOOD_NAMES: set[bytes] = set()             # header names already checked (a bounded set)


def check_name(name: bytes) -> None:
    """``RuntimeError`` for a name that is not a token (remembered when it is one)."""
    if name in GOOD_NAMES:
        return
    if not name or BAD_NAME.search(name):
        raise RuntimeError(f"invalid HTTP header name {name[:40]!r}")
    if len(GOOD_NAMES) < 1024:
        GOOD_NAMES.add(name)


def check_value(name: bytes, value: bytes) -> None:
    if BAD_VALUE.search(value):
        raise RuntimeError(f"invalid HTTP header value for {name[:40]!r}")


def header_lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    """``name: value\r\n`` lines, each name and value checked (``RuntimeError``)."""
    parts = []
    for name, value in headers:
        check_name(name)
        check_value(name, value)
        parts += (name, b": ", value, b"\r\n")
    return b"".join(parts)


_default_lines: tuple[list, bytes] = ([], b"")


def default_lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    """uvicorn's default headers (``date`` and ``--header`` ones) as header lines: checked
    and encoded once per list (uvicorn makes a new one every second)."""
    global _default_lines
    seen, lines = _default_lines
    if headers is seen:
        return lines
    lines = header_lines([(name.lower(), value) for name, value in headers])
    _default_lines = (headers, lines)
    return lines
