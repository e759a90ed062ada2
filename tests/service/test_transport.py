"""The transport's one dependency on another project's internals: uvicorn's protocol."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from engine_advisor.service.transport.protocol import (
    UVICORN_TESTED,
    HttpProtocol,
    uvicorn_version_ok,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_uvicorn_is_one_the_protocol_is_tested_with():
    (lo_major, lo_minor), (hi_major, hi_minor) = UVICORN_TESTED
    assert uvicorn_version_ok(), (
        f"uvicorn {uvicorn.__version__} is installed, but service/transport/protocol.py "
        f"(a subclass of uvicorn's HttpToolsProtocol that uses its internals) is tested with "
        f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor} only: install that range, or run "
        "tests/service/test_proxy_hot_path.py and tests/service/test_e2e_serve.py against "
        "the new uvicorn and move UVICORN_TESTED and pyproject.toml's uvicorn line together")


def test_pyproject_pins_the_range_the_protocol_is_tested_with():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    line = next(d for d in deps if re.match(r"uvicorn\b", d))
    (a, b), (c, d) = UVICORN_TESTED
    assert line.replace(" ", "") == f"uvicorn>={a}.{b},<{c}.{d}"


def test_the_version_check_refuses_versions_outside_the_range():
    (a, b), (c, d) = UVICORN_TESTED
    assert uvicorn_version_ok(f"{a}.{b}.0") and uvicorn_version_ok(f"{a}.{b}.9")
    assert not uvicorn_version_ok(f"{c}.{d}.0")
    assert not uvicorn_version_ok(f"{a}.{b - 1}.7" if b else f"{a - 1}.99.0")


def test_the_uvicorn_internals_the_protocol_uses_are_there():
    """What the subclass calls or reads of uvicorn's protocol and cycle: a rename there
    fails here, not on the first request."""
    for name in ("_unset_keepalive_if_required", "_should_upgrade", "_start_asgi_task",
                 "on_response_complete", "send_400_response", "handle_websocket_upgrade",
                 "_unsupported_upgrade_warning", "on_headers_complete", "on_message_complete",
                 "connection_made", "connection_lost", "data_received", "on_header"):
        assert callable(getattr(HttpToolsProtocol, name, None)), name
    for name in ("run_asgi", "send", "receive"):
        assert callable(getattr(RequestResponseCycle, name, None)), name
    assert issubclass(HttpProtocol, HttpToolsProtocol)


def test_a_lane_body_keeps_its_chunks_and_joins_them_once():
    """uvicorn appends each parsed chunk with ``cycle.body += data``: the lane's body keeps
    the chunks as they are and joins them when read (a lone chunk is not copied at all)."""
    from engine_advisor.service.transport.cycle import Chunks

    body = Chunks()
    assert not body and len(body) == 0 and bytes(body) == b""
    one = b"x" * 70_000
    body += one
    body += b""
    assert len(body) == 70_000 and bytes(body) is one
    body += b'{"a":1}'
    assert body and len(body) == 70_007 and bytes(body) == one + b'{"a":1}'
    body.clear()
    assert len(body) == 0 and bytes(body) == b""


def test_a_long_bodys_buffer_takes_memory_as_its_bytes_come():
    """The buffer is not written when it is allocated (``bytearray(n)`` would write n zeros):
    a client that declares a long body holds the memory of the bytes it sent."""
    from engine_advisor.service.transport.cycle import _unfilled

    def rss_mib() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    before = rss_mib()
    buf = _unfilled(256 << 20)
    assert type(buf) is bytearray and len(buf) == 256 << 20
    assert rss_mib() - before < 64                  # not 256 MiB
    buf[:8] = b"01234567"
    assert bytes(buf[:8]) == b"01234567"


def test_a_long_declared_body_is_copied_into_one_buffer_once_a_quarter_has_come():
    """A body whose declared length is at least PRESIZED is copied into one buffer of that
    length once a quarter of it has arrived; its chunks are not kept beside it."""
    from engine_advisor.service.transport.cycle import PRESIZED, Chunks

    n = 4 * PRESIZED + 12
    data = bytes(range(256)) * (n // 256) + b"\x07" * (n % 256)
    body = Chunks()
    body.expect(n)
    assert body.buf is None                                # nothing sent: no buffer
    at = 0
    for size in (65_536, 200_000, 3, PRESIZED):             # a quarter is in after the fourth
        body += data[at:at + size]
        at += size
        assert (body.buf is not None) == (at * 4 >= n)
    assert body.buf is not None and len(body.buf) == n and body.parts == []
    while at < n:
        body += data[at:at + 262_144]
        at += 262_144
    assert len(body) == n and bytes(body) == data
    whole = body.whole()
    assert type(whole) is bytearray and whole == data and whole is body.buf   # no copy

    late = Chunks()                                        # a quarter already in: at once
    late += data[:n // 2]
    late.expect(n)
    assert late.parts == [] and late.buf[:n // 2] == data[:n // 2]
    late += data[n // 2:]
    assert late.whole() == data

    short = Chunks()                                       # fewer bytes than declared
    short.expect(n)
    short += data[:n // 2]
    assert short.whole() == data[:n // 2] and bytes(short) == data[:n // 2]

    more = Chunks()                                        # more than declared
    more.expect(PRESIZED)
    more += data[:PRESIZED]
    more += b"tail"
    assert more.whole() == data[:PRESIZED] + b"tail"
    more.clear()
    assert more.buf is None and more.expected == 0 and bytes(more) == b""
