"""Upstreams that misbehave without breaking HTTP: streams that do not end after ``[DONE]``,
bodies shorter than their ``Content-Length`` on a connection left open, answers that are not
JSON, and pooled connections left idle.

The proxy runs as a real process (``engine-advisor serve --upstreams``) in front of raw asyncio
servers on loopback that answer each POST as its ``x-case`` header says, and count, from their
side, the forwarding connections open at each moment.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
import yaml
from proc import Proc, start_all, wait_for
from rawserver import ThreadedServer, read_request

from engine_advisor.model.fit.dataset import parse_csv

pytestmark = pytest.mark.timeout(240)

TOKEN = "upstream-faults-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_CONNECTIONS = 4
GRACE_S = 1.0
IDLE_S = 1.0
KEEPALIVE_S = 1.0
GARBAGE = "BROKEN"           # in every invalid answer; must never reach a client in a 200


def event(rid: str) -> bytes:
    tok = json.dumps({"id": rid, "object": "text_completion", "model": "kimi-k3",
                      "choices": [{"index": 0, "text": rid, "finish_reason": None}]})
    return b"data: " + tok.encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def answer(rid: str) -> bytes:
    return json.dumps({"id": rid, "object": "text_completion", "model": "kimi-k3",
                       "choices": [{"index": 0, "text": rid, "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                 "total_tokens": 4}}).encode()


def head(ctype: bytes, framing: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\n" + framing + b"\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


SSE, JSON = b"text/event-stream", b"application/json"
CHUNKED = b"transfer-encoding: chunked\r\n"
BROKEN_BODY = b'{"id": "c1", "choices": [ ' + GARBAGE.encode()


def respond(case: str, rid: str) -> tuple[bytes | list[bytes], bool]:
    """(what the upstream writes, in one write or several, and whether the response is
    complete: else the connection is left open with nothing more sent)."""
    if case == "normal-stream":
        body = event(rid) + DONE
        return head(SSE, CHUNKED) + chunk(body) + b"0\r\n\r\n", True
    if case == "normal":
        body = answer(rid)
        return head(JSON, b"content-length: %d\r\n" % len(body)) + body, True
    if case == "done-unterminated":           # [DONE], then no chunked terminator
        return head(SSE, CHUNKED) + chunk(event(rid)) + chunk(DONE), False
    if case == "done-short":                  # [DONE], then fewer bytes than Content-Length
        body = event(rid) + DONE
        return head(SSE, b"content-length: %d\r\n" % (len(body) + 100)) + body, False
    if case == "short-body":                  # a whole answer cut short, connection left open
        body = answer(rid)
        return head(JSON, b"content-length: %d\r\n" % (len(body) + 1000)) + body, False
    if case == "short-stream":                # events, then nothing (no [DONE], no end)
        return head(SSE, CHUNKED) + chunk(event(rid)), False
    if case == "bad-whole":
        return head(JSON, b"content-length: %d\r\n" % len(BROKEN_BODY)) + BROKEN_BODY, True
    if case == "bad-first":
        body = b"data: " + BROKEN_BODY + b"\n\n" + event(rid) + DONE
        return head(SSE, CHUNKED) + chunk(body) + b"0\r\n\r\n", True
    if case == "bad-mid":                      # a good event first, its own write
        return [head(SSE, CHUNKED) + chunk(event(rid)),
                chunk(b"data: " + BROKEN_BODY + b"\n\n" + DONE) + b"0\r\n\r\n"], True
    if case == "bad-empty-data":
        body = event(rid) + b"data:\n\n" + DONE
        return head(SSE, CHUNKED) + chunk(body) + b"0\r\n\r\n", True
    raise ValueError(case)


class RawUpstream(ThreadedServer):
    """The misbehaving server, on its own event loop in a thread; ``mode`` (when set) is the
    case of every POST, else its ``x-case`` header, else normal."""

    def __init__(self, mode: str | None = None, delay: float = 0.0):
        self.mode, self.delay = mode, delay
        self.open = 0           # forwarding connections (those that carried a POST) open now
        self.peak = 0
        super().__init__()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        posted = False
        try:
            while True:
                line, fields, body = await read_request(reader)
                if line.startswith("GET "):
                    writer.write(head(JSON, b"content-length: 11\r\n") + b'{"ok":true}')
                    continue
                if not posted:
                    posted = True
                    self.open += 1
                    self.peak = max(self.peak, self.open)
                req = json.loads(body)
                case = self.mode or fields.get("x-case") or (
                    "normal-stream" if req.get("stream") else "normal")
                if self.delay:
                    await asyncio.sleep(self.delay)
                out, complete = respond(case, req["prompt"])
                for i, piece in enumerate(out if isinstance(out, list) else [out]):
                    if i:
                        await asyncio.sleep(0.05)     # its own read at the proxy
                    writer.write(piece)
                    await writer.drain()
                if not complete:                # nothing more on it: wait for the close
                    await reader.read()
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError,
                asyncio.CancelledError):
            pass
        finally:
            self.open -= posted
            writer.close()


def proxy_for(tmp_path, ups: list[RawUpstream], **extra) -> Proc:
    doc = {"pools": {"vllm": [{"name": f"up{i}", "url": u.url, "model": "kimi-k3",
                               "max_connections": MAX_CONNECTIONS}
                              for i, u in enumerate(ups)]},
           "workload": {"kv_bytes_per_token": 70272, "gpu": "B300", "num_gpus": 8},
           "tokens": {"upstream_tokenize": False},
           "timeouts": {"connect_s": 3.0, "first_byte_s": 10.0, "idle_s": IDLE_S,
                        "total_s": 60.0, "end_grace_s": GRACE_S},
           "retries": {"max_attempts": 1},
           "breaker": {"failure_threshold": 1000},
           "health": {"interval_s": 60}}
    for k, v in extra.items():
        doc[k] = {**doc.get(k, {}), **v} if isinstance(v, dict) else v
    path = tmp_path / "upstreams.yaml"
    path.write_text(yaml.safe_dump(doc))
    return Proc("serve", "--upstreams", str(path), "--log-level", "warning", ready="/readyz",
                env={"ENGINE_ADVISOR_ADMIN_TOKEN": TOKEN,
                     "ENGINE_ADVISOR_UPSTREAMS_WATCH_S": "0"})


def metric(url: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def ask(c: httpx.Client, rid: str, case: str | None = None, stream: bool = False):
    return c.post("/v1/completions", headers={"x-case": case} if case else {},
                  json={"model": "kimi-k3", "prompt": rid, "max_tokens": 1, "stream": stream})


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    up = RawUpstream()
    proxy = proxy_for(tmp_path_factory.mktemp("faulty"), [up])
    start_all(proxy)
    try:
        yield proxy, up
    finally:
        proxy.stop()
        up.stop()


# ------------------------------------------------------------------ a stream over at [DONE]
@pytest.mark.parametrize("case, n", [("done-unterminated", 50), ("done-short", 12)])
def test_a_stream_is_over_at_done_and_never_holds_the_pool(faulty, case, n):
    proxy, up = faulty
    ok0 = metric(proxy.url, "engine_advisor_proxy_requests_total", upstream="up0",
                 status="200")
    unended0 = metric(proxy.url, "engine_advisor_proxy_upstream_faults_total", upstream="up0",
                      reason="unended")
    rows0 = len(parse_csv(httpx.get(proxy.url + "/v1/observations", headers=AUTH).text))
    waits = []
    with httpx.Client(base_url=proxy.url, timeout=30) as c:
        for i in range(n):
            t0 = time.monotonic()
            r = ask(c, f"{case}-{i}", case, stream=True)
            waits.append(time.monotonic() - t0)
            assert r.status_code == 200, (i, r.text[:300])
            assert r.text.endswith("data: [DONE]\n\n") and f'"{case}-{i}"' in r.text, r.text
            assert "error" not in r.text
    # each 5th request waits for a connection whose grace runs out, none for more
    assert max(waits) <= GRACE_S + 1.0, waits
    assert up.peak <= MAX_CONNECTIONS
    # counted and observed as any finished request; each connection closed, counted as a fault
    assert metric(proxy.url, "engine_advisor_proxy_requests_total", upstream="up0",
                  status="200") == ok0 + n
    rows = parse_csv(httpx.get(proxy.url + "/v1/observations", headers=AUTH).text)
    assert len(rows) == rows0 + n
    assert wait_for(lambda: metric(proxy.url, "engine_advisor_proxy_upstream_faults_total",
                                   upstream="up0", reason="unended") == unended0 + n,
                    GRACE_S + 5, 0.1)
    assert wait_for(lambda: up.open == 0, 5)
    assert metric(proxy.url, "engine_advisor_proxy_upstream_in_flight", upstream="up0") == 0


@pytest.mark.parametrize("case, stream", [("short-body", False), ("short-stream", True)])
def test_an_answer_that_stops_mid_body_ends_within_idle_s(faulty, case, stream):
    proxy, up = faulty
    with httpx.Client(base_url=proxy.url, timeout=30) as c:
        t0 = time.monotonic()
        r = ask(c, f"{case}-1", case, stream=stream)
        took = time.monotonic() - t0
    assert IDLE_S * 0.9 <= took <= IDLE_S + 2.0, took
    if stream:                               # the event came, then the error event
        assert r.status_code == 200
        last = [ln for ln in r.text.split("\n") if ln.startswith("data: ")][-1]
        err = json.loads(last[6:])["error"]
    else:
        assert r.status_code in (502, 504), r.text
        err = r.json()["error"]
    assert err["code"] in (502, 504) and "no " in err["message"], err
    assert wait_for(lambda: up.open == 0, 5)
    # the next ones are served at once
    with httpx.Client(base_url=proxy.url, timeout=30) as c:
        assert ask(c, "after").status_code == 200
        assert ask(c, "after-s", stream=True).text.endswith("data: [DONE]\n\n")


# ------------------------------------------------------------------ garbage is a failure
@pytest.mark.parametrize("case, stream", [("bad-whole", False), ("bad-first", True),
                                          ("bad-mid", True), ("bad-empty-data", True)])
def test_an_answer_that_is_not_json_never_reaches_the_client_as_a_success(faulty, case, stream):
    proxy, _ = faulty
    before = metric(proxy.url, "engine_advisor_proxy_upstream_faults_total", upstream="up0",
                    reason="invalid")
    with httpx.Client(base_url=proxy.url, timeout=30) as c:
        r = ask(c, f"{case}-1", case, stream=stream)
    assert GARBAGE not in r.text
    if r.status_code == 200:                 # after a first good event: an error event last
        assert case == "bad-mid" or case == "bad-empty-data", r.text
        datas = [ln[6:] for ln in r.text.split("\n") if ln.startswith("data:")]
        assert datas and all(json.loads(d) for d in datas), r.text      # every one JSON
        assert json.loads(datas[-1])["error"]["code"] == 502
        assert "[DONE]" not in r.text
    else:
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == 502 and "JSON" in r.json()["error"]["message"]
    assert metric(proxy.url, "engine_advisor_proxy_upstream_faults_total", upstream="up0",
                  reason="invalid") == before + 1
    assert metric(proxy.url, "engine_advisor_proxy_requests_total", upstream="up0",
                  status="502") >= 1


@pytest.mark.parametrize("case, stream", [("bad-whole", False), ("bad-first", True),
                                          ("bad-mid", True)])
def test_the_openai_sdk_raises_an_api_error_on_garbage(faulty, case, stream):
    proxy, _ = faulty
    c = openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0,
                      timeout=30.0, default_headers={"x-case": case})
    with pytest.raises(openai.APIError) as info:
        if stream:
            for _ in c.completions.create(model="kimi-k3", prompt=f"{case}-sdk", max_tokens=1,
                                          stream=True):
                pass
        else:
            c.completions.create(model="kimi-k3", prompt=f"{case}-sdk", max_tokens=1)
    assert GARBAGE not in str(info.value)


# ------------------------------------------------------------------ the breaker
@pytest.mark.parametrize("case, stream", [("bad-whole", False), ("bad-first", True)])
def test_garbage_opens_the_breaker_and_a_garbage_probe_keeps_it_open(tmp_path, case, stream):
    bad, good = RawUpstream(mode=case), RawUpstream()
    proxy = proxy_for(tmp_path, [bad, good], breaker={"failure_threshold": 2, "open_s": 2.0,
                                                      "max_open_percent": 100})
    start_all(proxy)

    def breaker() -> str:
        st = httpx.get(proxy.url + "/v1/upstreams", headers=AUTH, timeout=5).json()
        return {u["name"]: u["breaker"] for u in st["upstreams"]}["up0"]

    def one(c: httpx.Client, i: int) -> str:
        r = ask(c, f"req-{i}", stream=stream)
        assert GARBAGE not in r.text
        if r.headers["x-engine-advisor-upstream"] == "up0":
            assert r.status_code == 502, r.text
        else:
            assert r.status_code == 200, r.text
        return r.headers["x-engine-advisor-upstream"]

    try:
        with httpx.Client(base_url=proxy.url, timeout=30) as c:
            served = [one(c, i) for i in range(8)]       # round robin: up0 fails twice
            assert served.count("up0") == 2, served
            assert breaker() == "open"
            assert [one(c, i) for i in range(8, 12)] == ["up1"] * 4     # while it is open
            time.sleep(2.2)                               # open_s: half-open, one probe
            served = [one(c, i) for i in range(12, 16)]
            assert served.count("up0") == 1, served      # the probe got garbage...
            assert breaker() == "open"                    # ...and opened it again
            assert served[served.index("up0") + 1:] == ["up1"] * (3 - served.index("up0"))
    finally:
        proxy.stop()
        bad.stop()
        good.stop()


# ------------------------------------------------------------------ idle pooled sockets
def test_idle_pooled_connections_are_closed_after_keepalive(tmp_path):
    up = RawUpstream(delay=0.3)                # concurrent requests need their own sockets
    proxy = proxy_for(tmp_path, [up])
    path = tmp_path / "upstreams.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["pools"]["vllm"][0]["timeouts"] = {"keepalive_s": KEEPALIVE_S}   # the upstream's own
    path.write_text(yaml.safe_dump(doc))
    start_all(proxy)
    try:
        async def burst():
            async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as c:
                return await asyncio.gather(*(c.post("/v1/completions", json={
                    "model": "kimi-k3", "prompt": f"k{i}", "max_tokens": 1})
                    for i in range(MAX_CONNECTIONS)))
        assert all(r.status_code == 200 for r in asyncio.run(burst()))
        assert up.open >= 2                     # pooled, idle, and nobody uses the pool again
        assert wait_for(lambda: up.open == 0, KEEPALIVE_S + 5, 0.05), up.open
    finally:
        proxy.stop()
        up.stop()


# ------------------------------------------------------------------ the check itself
def test_every_data_line_is_checked_and_the_bad_event_located():
    from engine_advisor.service.proxy.relay.valid import first_invalid, is_json

    ok = b'data: {"a": 1}\n\n'
    assert first_invalid(ok * 3 + DONE) == -1
    assert first_invalid(b": ping\n\nevent: e\nid: 7\ndata: [1]\n\n" + DONE) == -1
    assert first_invalid(b'data:{"a":1}\r\n\r\ndata: [DONE]\r\n\r\n') == -1
    for bad in (b"data: {bad\n\n", b"data:\n\n", b"data: \n\n", b"data: [DONE] x\n\n",
                b'event: e\ndata: {"a":\n\n', b"data: nan\n\n"):
        assert first_invalid(ok + bad + ok) == len(ok), bad
        assert first_invalid((ok + bad + ok).replace(b"\n", b"\r\n")) == len(ok) + 2, bad
    assert first_invalid(ok + b"\n" + ok + b"data: x\n\n") == 2 * len(ok) + 1
    # what Python clients parse passes: NaN, Infinity, lone surrogate escapes
    assert is_json(b"[NaN, Infinity]") and is_json(b'"\\ud800"')
    assert not is_json(b"") and not is_json(b"\xff") and not is_json(b"[" * 100_000)
