"""Long request bodies through ``serve --upstreams`` (real processes on loopback): a body of at
least ``PRESIZED`` bytes with a declared length is gathered into one buffer
(``engine_advisor.service.transport.cycle.Chunks.expect``), and what reaches the upstream is
the client's body, byte for byte, whichever way it arrived: in one write, in small pieces with
pauses, chunked (no declared length), or after a client that declared a long body and went
away."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import time

import httpx
import pytest
import yaml
from proc import Proc, start_all
from rawserver import ThreadedServer, read_request

from engine_advisor.service.transport.cycle import PRESIZED

pytestmark = pytest.mark.timeout(120)


class Recorder(ThreadedServer):
    """An upstream that records the sha256 and the length of each body it is sent."""

    def __init__(self):
        self.bodies: list[tuple[str, int]] = []
        super().__init__()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line, _, body = await read_request(reader)
                if line.startswith("POST "):
                    self.bodies.append((hashlib.sha256(body).hexdigest(), len(body)))
                out = json.dumps({"id": "x", "object": "text_completion", "model": "kimi-k3",
                                  "choices": [{"index": 0, "text": "ok",
                                               "finish_reason": "length"}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                            "total_tokens": 4}}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(out) + out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    up = Recorder()
    doc = {"pools": {"vllm": [{"name": "rec", "url": up.url, "model": "kimi-k3"}]},
           "workload": {"kv_bytes_per_token": 70272, "gpu": "B300", "num_gpus": 8},
           "tokens": {"upstream_tokenize": False},
           "health": {"interval_s": 60}}
    path = tmp_path_factory.mktemp("long") / "upstreams.yaml"
    path.write_text(yaml.safe_dump(doc))
    proxy = Proc("serve", "--upstreams", str(path), "--log-level", "warning", ready="/readyz",
                 env={"ENGINE_ADVISOR_PROXY_MAX_BODY_BYTES": str(64 << 20)})
    start_all(proxy)
    try:
        yield proxy, up
    finally:
        proxy.stop()
        up.stop()


def chat(size: int) -> bytes:
    words = " ".join(f"w{i % 997}" for i in range(size // 4))
    return json.dumps({"model": "kimi-k3", "max_tokens": 1,
                       "messages": [{"role": "user", "content": words[:size]}]}).encode()


def ids(count: int) -> bytes:
    return json.dumps({"model": "kimi-k3", "max_tokens": 1,
                       "prompt": [100 + i % 5000 for i in range(count)]}).encode()


def sent(up: Recorder, body: bytes) -> bool:
    return (hashlib.sha256(body).hexdigest(), len(body)) in up.bodies


def raw_post(url: str, body: bytes, *, pieces: int = 1, pause: float = 0.0,
             chunked: bool = False, stop_after: int | None = None) -> bytes:
    """POST ``body`` over a raw socket: in ``pieces`` writes ``pause`` s apart, chunked, or
    cut after ``stop_after`` bytes (then the socket is closed); the answer's bytes."""
    host, port = url.removeprefix("http://").split(":")
    framing = (b"transfer-encoding: chunked\r\n" if chunked
               else b"content-length: %d\r\n" % len(body))
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\nconnection: close\r\n" + framing + b"\r\n")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head)
        step = -(-len(body) // pieces)
        for at in range(0, len(body), step):
            piece = body[at:at + step]
            if stop_after is not None and at + len(piece) > stop_after:
                s.sendall(piece[:stop_after - at])
                return b""
            s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            time.sleep(pause)
        if chunked:
            s.sendall(b"0\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize("body", [chat(3 * PRESIZED), ids(400_000), chat(PRESIZED // 2)],
                         ids=["chat-3MiB", "ids-2.6MiB", "chat-0.5MiB"])
def test_a_long_body_reaches_the_upstream_as_sent(proxied, body):
    proxy, up = proxied
    with httpx.Client(base_url=proxy.url, timeout=30) as h:
        path = "/v1/completions" if b'"prompt"' in body else "/v1/chat/completions"
        r = h.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert sent(up, body)


def test_a_long_body_in_pieces_chunked_or_abandoned(proxied):
    proxy, up = proxied
    body = chat(2 * PRESIZED)
    out = raw_post(proxy.url, body, pieces=40, pause=0.005)       # in pieces, with pauses
    assert out.startswith(b"HTTP/1.1 200") and sent(up, body)
    other = chat(2 * PRESIZED + 100)
    out = raw_post(proxy.url, other, pieces=8, chunked=True)      # no declared length
    assert out.startswith(b"HTTP/1.1 200") and sent(up, other)
    n = len(up.bodies)
    for cut in (10, len(body) // 4 + 1, len(body) - 1):           # a declared body cut short
        raw_post(proxy.url, body, pieces=16, stop_after=cut)
    last = chat(2 * PRESIZED + 200)
    out = raw_post(proxy.url, last)                               # and the proxy goes on
    assert out.startswith(b"HTTP/1.1 200") and sent(up, last)
    assert len(up.bodies) == n + 1                                # nothing cut was sent
