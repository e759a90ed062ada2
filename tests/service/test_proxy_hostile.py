"""The proxy against a hostile upstream: a raw asyncio server answering each request with the
malformed (or tricky) response its ``x-case`` header names.

For every case the client gets exactly the right answer or a 5xx in the OpenAI error envelope,
within a bounded time, with nothing of the hostile response smuggled into its body or headers;
right after it, concurrent normal requests (plain and streamed) each get their own answer, so
no connection the case touched was reused in a bad state. The proxy runs as a real process
(``engine-advisor serve --upstreams``) with one upstream of at most 4 connections, small
limits and no retries or breaker trips, so every case lands on the pool the next requests use.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import yaml
from proc import Proc, start_all, wait_for
from rawserver import ThreadedServer, read_request

pytestmark = pytest.mark.timeout(180)

MAX_CONNECTIONS = 4
LIMITS = {"header_bytes": 16384, "body_bytes": 65536, "event_bytes": 16384,
          "trailer_bytes": 1024}
TOTAL_S = 5.0
EVIL = "SMUGGLED"                 # in every hostile response; must never reach a client


def answer(rid: str) -> bytes:
    return json.dumps({"id": rid, "object": "text_completion", "model": "kimi-k3",
                       "choices": [{"index": 0, "text": rid, "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                 "total_tokens": 4}}).encode()


def sized(body: bytes, extra: bytes = b"", status: bytes = b"200 OK") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def chunked(pieces: list[bytes], size=lambda n: b"%x" % n, trailers: bytes = b"",
            head: bytes = b"transfer-encoding: chunked\r\n",
            ctype: bytes = b"application/json") -> bytes:
    out = b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\n" + head + b"\r\n"
    for p in pieces:
        out += size(len(p)) + b"\r\n" + p + b"\r\n"
    return out + b"0\r\n" + trailers + b"\r\n"


def events(rid: str) -> list[bytes]:
    tok = json.dumps({"id": rid, "object": "text_completion",
                      "choices": [{"index": 0, "text": rid}]}).encode()
    return [b"data: " + tok + b"\n\n", b"data: [DONE]\n\n"]


def evil(rid: str) -> bytes:
    return answer(EVIL)


# case -> (what the upstream writes for request id ``rid``, what the client must get:
# "ok" = exactly the right answer, "5xx" = an error envelope, "either" = one of the two)
CASES = {
    "cl-negative": (lambda r: sized(answer(r)).replace(b"content-length: ", b"content-length: -",
                                                       1), "5xx"),
    "cl-plus": (lambda r: sized(answer(r)).replace(b"content-length: ", b"content-length: +", 1),
                "5xx"),
    "cl-duplicate": (lambda r: sized(answer(r), b"content-length: 5\r\n"), "5xx"),
    "te-and-cl": (lambda r: chunked([answer(r)], head=b"transfer-encoding: chunked\r\n"
                                    b"content-length: 7\r\n"), "5xx"),
    "te-substring": (lambda r: chunked([answer(r)], head=b"transfer-encoding: xchunked\r\n"),
                     "5xx"),
    "chunk-0x": (lambda r: chunked([answer(r)], size=lambda n: b"0x%x" % n), "5xx"),
    "chunk-plus": (lambda r: chunked([answer(r)], size=lambda n: b"+%x" % n), "5xx"),
    "chunk-spaces": (lambda r: chunked([answer(r)], size=lambda n: b" %x " % n), "5xx"),
    "chunk-underscore": (lambda r: chunked([answer(r)], size=lambda n: b"0_%x" % n), "5xx"),
    "chunk-huge": (lambda r: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                   b"ffffffffffffffff\r\n" + answer(EVIL) * 2000, "5xx"),
    "header-no-colon": (lambda r: sized(answer(r), b"x-bad header line\r\n"), "5xx"),
    "header-obs-fold": (lambda r: sized(answer(r), b"x-folded: a\r\n  b\r\n"), "5xx"),
    "header-bare-lf": (lambda r: sized(answer(r), b"x-a: 1\nx-smuggled: 1\r\n"), "5xx"),
    "header-200kb": (lambda r: sized(answer(r), b"x-big: " + b"a" * 200_000 + b"\r\n"), "5xx"),
    "header-nul": (lambda r: sized(answer(r), b"x-a: 1\x00x\r\n"), "5xx"),
    "status-garbage": (lambda r: b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "5xx"),
    "status-4-digits": (lambda r: sized(answer(r), status=b"2000 OK"), "5xx"),
    "status-099": (lambda r: sized(answer(r), status=b"099 Odd"), "5xx"),
    "http-2.0": (lambda r: sized(answer(r)).replace(b"HTTP/1.1", b"HTTP/2.0", 1), "5xx"),
    "switching-101": (lambda r: b"HTTP/1.1 101 Switching Protocols\r\nupgrade: evil\r\n"
                      b"connection: upgrade\r\n\r\n" + sized(answer(r)), "5xx"),
    "early-hints-103": (lambda r: b"HTTP/1.1 103 Early Hints\r\nlink: </x>; rel=preload\r\n"
                        b"x-smuggled: 1\r\n\r\n" + sized(answer(r)), "ok"),
    "continue-100": (lambda r: b"HTTP/1.1 100 Continue\r\n\r\n" + sized(answer(r)), "ok"),
    "interim-flood": (lambda r: b"HTTP/1.1 103 Early Hints\r\n\r\n" * 50 + sized(answer(r)),
                      "5xx"),
    "second-response": (lambda r: sized(answer(r)) + sized(answer(EVIL)), "either"),
    "second-response-later": (lambda r: [sized(answer(r)), sized(answer(EVIL))], "either"),
    "garbage-after-body": (lambda r: sized(answer(r)) + b"HTTP/1.1 200 OK\r\nx-smuggled: 1",
                           "either"),
    "body-over-limit": (lambda r: sized(answer(r) + b" " * 70_000), "5xx"),
    "chunked-over-limit": (lambda r: chunked([answer(r)] + [b" " * 8000] * 10), "5xx"),
    "trailers-over-limit": (lambda r: chunked([answer(r)], trailers=b"".join(
        b"x-t%d: %s\r\n" % (i, b"v" * 100) for i in range(40))), "5xx"),
    "chunk-extension-flood": (lambda r: chunked([answer(r)], size=lambda n: b"%x;" % n
                                                + b"e=1;" * 2000), "5xx"),
    "closed-mid-body": (lambda r: sized(answer(r))[:-10], "5xx"),
    "until-close": (lambda r: b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"connection: close\r\n\r\n" + answer(r), "ok"),
    "stream-event-over-limit": (lambda r: chunked([b"data: " + b"x" * 20_000],
                                                  ctype=b"text/event-stream"), "5xx"),
    # well framed, but not what a client can parse
    "body-not-json": (lambda r: sized(b'{"id": "' + r.encode() + b'", "choices": [ ' +
                                      EVIL.encode()), "5xx"),
    "stream-not-json": (lambda r: chunked([b"data: {" + EVIL.encode() + b"\n\n",
                                           b"data: [DONE]\n\n"], ctype=b"text/event-stream"),
                        "5xx"),
}
CLOSE_AFTER = {"closed-mid-body", "until-close", "chunk-huge"}
STREAMED = {"stream-event-over-limit", "stream-not-json"}


class Upstream(ThreadedServer):
    """The hostile server, on its own event loop in a thread."""

    def __init__(self):
        self.open = 0           # connections that carried completions (not health checks)
        super().__init__()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        posted = False          # counted in ``open``: connections of the forwarding pool
        try:
            while True:
                line, fields, body = await read_request(reader)
                if line.startswith("GET "):
                    writer.write(sized(b'{"ok":true}'))
                    continue
                if not posted:
                    posted = True
                    self.open += 1
                req = json.loads(body)
                rid, case = req["prompt"], fields.get("x-case", "normal")
                if case == "normal":
                    out = chunked(events(rid), ctype=b"text/event-stream") if req.get(
                        "stream") else sized(answer(rid))
                else:
                    out = CASES[case][0](rid)
                for piece in out if isinstance(out, list) else [out]:
                    writer.write(piece)
                    await writer.drain()
                if case in CLOSE_AFTER:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError,
                asyncio.CancelledError):
            pass
        finally:
            self.open -= posted
            writer.close()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    up = Upstream()
    doc = {"pools": {"vllm": [{"name": "hostile", "url": f"http://127.0.0.1:{up.port}",
                               "model": "kimi-k3", "max_connections": MAX_CONNECTIONS}]},
           "workload": {"kv_bytes_per_token": 70272, "gpu": "B300", "num_gpus": 8},
           "tokens": {"upstream_tokenize": False},
           "timeouts": {"connect_s": 2.0, "first_byte_s": TOTAL_S, "idle_s": TOTAL_S,
                        "total_s": TOTAL_S},
           "retries": {"max_attempts": 1},
           "breaker": {"failure_threshold": 1000},
           "health": {"interval_s": 60},
           "limits": LIMITS}
    path = tmp_path_factory.mktemp("hostile") / "upstreams.yaml"
    path.write_text(yaml.safe_dump(doc))
    proxy = Proc("serve", "--upstreams", str(path), "--log-level", "warning", ready="/readyz")
    start_all(proxy)
    try:
        yield proxy, up
    finally:
        proxy.stop()
        up.stop()


async def ask(c: httpx.AsyncClient, rid: str, case: str = "normal",
              stream: bool = False) -> httpx.Response:
    return await c.post("/v1/completions", headers={"x-case": case}, json={
        "model": "kimi-k3", "prompt": rid, "max_tokens": 1, "stream": stream})


def assert_clean(r: httpx.Response) -> None:
    assert EVIL not in r.text
    assert not any(k.lower().startswith(("x-smuggled", "x-big", "x-bad", "x-folded", "link",
                                         "upgrade"))
                   for k in r.headers), dict(r.headers)


def streamed_text(r: httpx.Response) -> str:
    texts = []
    for line in r.text.split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            texts.append(json.loads(line[6:])["choices"][0]["text"])
    assert r.text.rstrip().endswith("data: [DONE]"), r.text[-200:]
    return "".join(texts)


async def normal_round(c: httpx.AsyncClient, tag: str) -> None:
    """Eight concurrent normal requests (two streamed): each gets its own answer."""
    ids = [f"{tag}-{i}" for i in range(8)]
    rs = await asyncio.gather(*(ask(c, rid, stream=i >= 6) for i, rid in enumerate(ids)))
    for i, (rid, r) in enumerate(zip(ids, rs, strict=True)):
        assert r.status_code == 200, (rid, r.status_code, r.text[:300])
        assert_clean(r)
        if i >= 6:
            assert streamed_text(r) == rid
        else:
            assert r.json()["choices"][0]["text"] == rid and r.json()["id"] == rid


async def run_case(url: str, case: str, expect: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as c:
        await normal_round(c, f"{case}-before")     # connections pooled and in use
        t0 = time.monotonic()
        r = await ask(c, f"{case}-victim", case, stream=case in STREAMED)
        took = time.monotonic() - t0
        assert took < TOTAL_S + 10, f"{case}: {took:.1f} s"
        assert_clean(r)
        if r.status_code >= 500:
            assert expect in ("5xx", "either"), (case, r.status_code, r.text[:300])
            err = r.json()["error"]
            assert err["code"] == r.status_code and err["message"], r.text
        else:
            assert expect in ("ok", "either"), (case, r.status_code, r.text[:300])
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == f"{case}-victim"
            assert r.json()["id"] == f"{case}-victim"
        await normal_round(c, f"{case}-after")
        await normal_round(c, f"{case}-again")
        return r


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_response(hostile, case):
    proxy, up = hostile
    r = asyncio.run(run_case(proxy.url, case, CASES[case][1]))
    if r.status_code >= 500 and "limit" in case:
        assert "LimitError" in proxy.log, proxy.log[-2000:]     # the log line of a limit
    # refused connections are closed: never more open than the pool may hold
    assert wait_for(lambda: up.open <= MAX_CONNECTIONS, 10), up.open


def test_enough_kinds_of_malformed_responses():
    assert sum(1 for _, e in CASES.values() if e != "ok") >= 15
