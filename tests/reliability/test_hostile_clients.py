"""Hostile clients against ``engine-advisor serve --upstreams`` in front of two simulators (a
vLLM pool and an SGLang pool), all real processes on loopback, driven over raw sockets.

- The front door (engine_advisor.service.frontdoor): an oversized head (one huge header, thousands
  of
  fields) is a 431 and the connection is closed, without parsing it and without stalling
  other clients; a connection that sends nothing, a head or a body that trickles in are cut
  off by their timeouts (408); past the connection cap a new connection gets a 503; a
  transfer coding other than chunked is a 501.
- Malformed JSON (nested too deeply, an integer of too many digits, a lone surrogate) is a 400
  in the error envelope on the REST API, the proxy and the simulators, and nothing is logged.
- A request that every upstream fails (a 500 it causes itself) trips no breaker: the normal
  requests after it are served.
- A non-streamed request whose upstream never answers gets a 504 after ``answer_s``.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest
from rel_helpers import Proc, metric_sum, serve_proc, start_all

pytestmark = pytest.mark.timeout(300)

HEAD_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 48
FRONT_DOOR = {"ENGINE_ADVISOR_HEADER_TIMEOUT_S": str(HEAD_TIMEOUT_S),
              "ENGINE_ADVISOR_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
              "ENGINE_ADVISOR_MAX_CONNECTIONS": str(MAX_CONNECTIONS)}
CHAT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
SEED = {"context_tokens": 65536, "output_tokens": 2048, "batch_size": 64,
        "kv_bytes_per_token": 70272}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    sims = [Proc("sim", "--engine", "vllm", "--time-scale", "0.001"),
            Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale", "0.001")]
    # breakers as easy to trip as they get: two failures open one for a minute
    srv = serve_proc(tmp, sims[:1], sims[1:], env=FRONT_DOOR,
                     breaker={"failure_threshold": 2, "open_s": 60},
                     timeouts={"answer_s": 1.5})
    procs = start_all(*sims, srv)
    try:
        yield {"serve": srv, "vllm": sims[0], "sglang": sims[1]}
    finally:
        for p in procs:
            p.stop()


# ------------------------------------------------------------------ raw sockets
def connect(url: str, timeout: float = 30.0) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=timeout)
    return s


def read_until_closed(s: socket.socket, limit: float = 30.0) -> tuple[bytes, bool]:
    """(what arrived, whether the server closed the connection) within ``limit`` seconds."""
    out = b""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        s.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            data = s.recv(65536)
        except TimeoutError:
            return out, False
        except ConnectionResetError:
            return out, True
        if not data:
            return out, True
        out += data
    return out, False


def exchange(s: socket.socket, *pieces: bytes) -> tuple[bytes, bool]:
    """Send ``pieces`` while reading what comes back (a refusal may come before the end:
    read at once, it cannot be lost to a reset); then close."""
    got: list[tuple[bytes, bool]] = []
    reader = threading.Thread(target=lambda: got.append(read_until_closed(s, limit=60)))
    reader.start()
    for p in pieces:
        send_quietly(s, p)
    reader.join(90)
    s.close()
    return got[0]


def send_quietly(s: socket.socket, data: bytes) -> None:
    """Send what the server takes; it may refuse (and close) before the end."""
    try:
        s.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def parse(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, headers, json.loads(body[: int(headers["content-length"])])


def refused(raw: bytes, status: int, *words: str) -> dict:
    got, headers, body = parse(raw)
    assert got == status, raw[:300]
    assert headers["connection"] == "close" and headers["content-type"] == "application/json"
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    for w in words:
        assert w in err["message"], err
    return err


def still_serving(url: str) -> None:
    assert httpx.get(url + "/healthz", timeout=30).status_code == 200
    r = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200, r.text


def head(path: str, extra: bytes = b"", method: bytes = b"POST") -> bytes:
    return (method + b" " + path.encode() + b" HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\n" + extra)


# ------------------------------------------------------------------ 1. the front door
HUGE = {"one-1MiB-header": (b"x-big: " + b"a" * (1 << 20) + b"\r\n", "61,440 bytes"),
        "10000-headers": (b"".join(b"x-h%d: 1\r\n" % i for i in range(10_000)), "61,440"),
        "150-headers": (b"".join(b"x-h%d: 1\r\n" % i for i in range(150)),
                        "more than 100 header fields"),
        "1MiB-url": (None, "61,440 bytes")}


@pytest.mark.parametrize("path", ["/v1/recommend", "/v1/chat/completions"])
@pytest.mark.parametrize("case", list(HUGE))
def test_an_oversized_head_is_a_431_and_the_connection_closed(stack, case, path):
    srv = stack["serve"]
    s = connect(srv.url)
    body = json.dumps(CHAT if "chat" in path else SEED).encode()
    extra, words = HUGE[case]
    if extra is None:
        data = (b"POST " + path.encode() + b"?" + b"q" * (1 << 20) + b" HTTP/1.1\r\nhost: x\r\n"
                b"content-length: %d\r\n\r\n" % len(body) + body)
    else:
        data = head(path, extra + b"content-length: %d\r\n\r\n" % len(body)) + body
    t = time.monotonic()
    raw, closed = exchange(s, data)
    refused(raw, 431, "request head too large", words)
    assert closed and time.monotonic() - t < 10
    still_serving(srv.url)


def test_a_pipelined_oversized_head_is_refused_too(stack):
    """The second request's head starts in the first one's packet (where it is not counted as
    it arrives) and ends past the limit: the parsed head is counted, the first request is
    answered, the second never."""
    srv = stack["serve"]
    s = connect(srv.url)
    first = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
    raw, closed = exchange(s, first + b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: "
                           + b"a" * 40_000, b"a" * 40_000 + b"\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200") and raw.count(b"HTTP/1.1 200") == 1, raw[:500]
    rest = raw[raw.index(b"}") + 1:]
    if rest:                                   # the 431 (or nothing: closed after the 200)
        refused(rest, 431, "request head too large")
    assert closed
    still_serving(srv.url)


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100   # utime + stime, clock ticks


def test_a_96_mib_header_is_refused_at_the_limit_and_stalls_no_one(stack):
    """Before: the header's pieces were joined quadratically, 9.7 s of CPU, every other client
    stalled 11.3 s. Now: refused after 60 KiB, the rest dropped unparsed."""
    srv = stack["serve"]
    latencies: list[float] = []
    stop = threading.Event()

    def others() -> None:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            while not stop.is_set():
                t = time.perf_counter()
                assert c.get("/healthz").status_code == 200
                latencies.append(time.perf_counter() - t)
                time.sleep(0.01)

    th = threading.Thread(target=others)
    th.start()
    try:
        time.sleep(0.3)
        cpu = _cpu_s(srv.proc.pid)
        s = connect(srv.url)
        raw, _ = exchange(s, head("/v1/chat/completions") + b"x-big: ", *[b"a" * (1 << 20)] * 96)
        used = _cpu_s(srv.proc.pid) - cpu
        time.sleep(0.3)
    finally:
        stop.set()
        th.join(60)
    refused(raw, 431, "61,440 bytes")
    assert latencies and max(latencies) < 2.0, max(latencies)
    assert used < 3.0, used              # reading and dropping 96 MiB, no parsing


def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout(stack):
    srv = stack["serve"]
    s = connect(srv.url)
    t = time.monotonic()
    raw, closed = read_until_closed(s, limit=HEAD_TIMEOUT_S + 20)
    waited = time.monotonic() - t
    s.close()
    assert closed and raw == b""                   # nothing was asked: nothing answered
    assert HEAD_TIMEOUT_S - 0.1 <= waited < HEAD_TIMEOUT_S + 15


@pytest.mark.parametrize("first", [False, True], ids=["fresh", "after-a-request"])
def test_a_head_sent_a_byte_at_a_time_gets_a_408(stack, first):
    srv = stack["serve"]
    s = connect(srv.url)
    if first:                                      # a kept-alive connection's next request
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        got = b""
        while b"\r\n\r\n" not in got or not got.endswith(b"}"):
            got += s.recv(65536)
        assert got.startswith(b"HTTP/1.1 200")
    t = time.monotonic()
    data = head("/v1/recommend")
    i = 0
    while time.monotonic() - t < HEAD_TIMEOUT_S + 20 and i < len(data):
        try:
            s.send(data[i:i + 1])
        except OSError:
            break
        i += 1
        time.sleep(0.2)
        s.setblocking(False)
        try:
            if s.recv(1, socket.MSG_PEEK):
                break                               # the answer is there
        except BlockingIOError:
            pass
        finally:
            s.setblocking(True)
    raw, closed = read_until_closed(s)
    s.close()
    refused(raw, 408, "request head not received within 2 s")
    assert closed and i < len(data)


@pytest.mark.parametrize("path", ["/v1/recommend", "/v1/chat/completions", "/v1/route"])
def test_a_body_that_trickles_in_gets_a_408_and_frees_its_memory(stack, path):
    """Sixteen clients each declaring a large body and sending 1 KiB every 0.2 s: each is cut
    off after the body timeout (before: held as long as they kept sending)."""
    srv = stack["serve"]
    declared = (512 << 10) if path == "/v1/recommend" else (32 << 20)     # under each cap
    socks = []
    for _ in range(16):
        s = connect(srv.url)
        s.sendall(head(path, b"content-length: %d\r\n\r\n" % declared) + b'{"pad": "')
        socks.append(s)
    t = time.monotonic()
    answers = [b""] * len(socks)
    open_ = set(range(len(socks)))
    while open_ and time.monotonic() - t < BODY_TIMEOUT_S + 20:
        for i in list(open_):
            try:
                socks[i].send(b" " * 1024)
            except OSError:
                pass
            socks[i].setblocking(False)
            try:
                data = socks[i].recv(65536)
                answers[i] += data
                if not data:
                    open_.discard(i)
            except BlockingIOError:
                pass
            except OSError:
                open_.discard(i)
            finally:
                socks[i].setblocking(True)
        time.sleep(0.2)
    for s in socks:
        s.close()
    assert not open_, f"{len(open_)} connections still open"
    for raw in answers:
        refused(raw, 408, "request body not received within 2 s")
    still_serving(srv.url)


def test_past_the_connection_cap_a_new_connection_gets_a_503(stack):
    srv = stack["serve"]
    held = [connect(srv.url) for _ in range(MAX_CONNECTIONS + 8)]
    try:
        time.sleep(0.5)
        answers = []
        for s in held[-8:]:
            s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            answers.append(read_until_closed(s, limit=10))
        extra = [a for a in answers if a[0]]
        assert extra, "no connection was refused"
        for raw, closed in extra:
            err = refused(raw, 503, "too many connections", f"at most {MAX_CONNECTIONS}")
            assert err["type"] == "service_unavailable" and closed
            assert b"retry-after: 1" in raw
    finally:
        for s in held:
            s.close()
    time.sleep(0.5)
    still_serving(srv.url)
    assert metric_sum(srv.url, "engine_advisor_http_refusals_total", reason="connections") >= 1


def test_idle_sockets_cannot_exhaust_a_256_file_process(tmp_path, stack):
    """Before: 2,000 idle sockets took every file of a 256-file process, which then answered
    each new client with EOF. Now: the default cap (half the limit less 128: 64) and at most
    16 refused connections lingering; every other client gets a 503, and once the idle ones
    are closed (head timeout) the process serves again."""
    srv = serve_proc(tmp_path, [stack["vllm"]], [stack["sglang"]],
                     env={"ENGINE_ADVISOR_HEADER_TIMEOUT_S": str(HEAD_TIMEOUT_S)})
    srv.args = ["sh", "-c", 'ulimit -n 256 && exec "$0" "$@"', *srv.args]
    start_all(srv)
    held: list[socket.socket] = []
    try:
        try:
            for _ in range(600):
                held.append(connect(srv.url))
            time.sleep(0.5)
            probe = connect(srv.url)
            raw, closed = exchange(probe, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            refused(raw, 503, "at most 64")
            assert srv.proc.poll() is None
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + HEAD_TIMEOUT_S + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(srv.url + "/healthz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        still_serving(srv.url)
        log = srv.log
    finally:
        srv.stop()
    assert "Too many open files" not in log and "Traceback" not in log, log[-3000:]


def test_transfer_encoding_other_than_chunked_is_a_501(stack):
    srv = stack["serve"]
    for te in (b"gzip, chunked", b"deflate,chunked", b"gzip", b"chunked, chunked"):
        s = connect(srv.url)
        body = json.dumps(CHAT).encode()
        raw, closed = exchange(s, head("/v1/chat/completions", b"transfer-encoding: " + te
                                       + b"\r\n\r\n") + b"%x\r\n" % len(body) + body
                               + b"\r\n0\r\n\r\n")
        if te in (b"gzip", b"chunked, chunked"):     # the parser's own refusal, or ours
            assert raw.startswith((b"HTTP/1.1 400", b"HTTP/1.1 501")), raw[:100]
            continue
        err = refused(raw, 501, "only 'chunked'")
        assert err["param"] == "transfer-encoding" and closed
    still_serving(srv.url)


# ------------------------------------------------------------------ 2. malformed JSON
DEEP = b'{"model": "kimi-k3", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
BIG = b'{"model": "kimi-k3", "max_tokens": ' + b"9" * 5000 + b"}"
LONE = b'{"model": "kimi-k3", "prompt": "hi \\ud800", "messages": [{"role": "user", ' \
       b'"content": "\\udfff"}], "text": "\\ud800", "context_tokens": 1000}'
MALFORMED = {"nested-100000-deep": (DEEP, "nested too deeply"),
             "integer-of-5000-digits": (BIG, "more than 4,300 digits"),
             "lone-surrogate": (LONE, "lone surrogate")}
SERVE_PATHS = ["/v1/recommend", "/v1/route", "/v1/chat/completions", "/v1/completions",
               "/generate", "/v1/predict", "/v1/plan"]
SIM_PATHS = {"vllm": ["/v1/completions", "/v1/chat/completions", "/tokenize"],
             "sglang": ["/v1/completions", "/generate", "/tokenize"]}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_json_is_a_400_everywhere_and_logs_nothing(stack, case):
    raw, words = MALFORMED[case]
    targets = [(stack["serve"], p) for p in SERVE_PATHS]
    targets += [(stack[e], p) for e, paths in SIM_PATHS.items() for p in paths]
    for proc, path in targets:
        r = httpx.post(proc.url + path, content=raw, timeout=60,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400, (proc.args[1], path, r.text[:300])
        body = r.json()
        err = body.get("error", body)          # SGLang's flat form: the message at the top
        message = err if isinstance(err, str) else err["message"]
        assert words in message, (path, message)
        if proc is stack["serve"]:
            assert set(err) == {"message", "type", "param", "code"} and err["code"] == 400
        assert b"Traceback" not in r.content
    for proc in (stack["serve"], stack["vllm"], stack["sglang"]):
        assert "Traceback" not in proc.log and "Exception" not in proc.log, proc.log[-3000:]


# ------------------------------------------------------------------ 3. breakers
def test_a_request_every_upstream_fails_trips_no_breaker(stack):
    """Before: each such request was retried on the other engine and counted against both
    breakers; four opened them all and the next normal requests got 503 for ``open_s``."""
    srv = stack["serve"]
    before = metric_sum(srv.url, "engine_advisor_proxy_request_failures_total")
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        for _ in range(12):
            r = c.post("/v1/chat/completions", json=CHAT, headers={"x-return-error": "500"})
            assert r.status_code == 500             # the upstream's own answer, passed on
        after = metric_sum(srv.url, "engine_advisor_proxy_request_failures_total")
        assert after - before == 12
        states = [metric_sum(srv.url, "engine_advisor_proxy_breaker_state", upstream=u)
                  for u in ("vllm-0", "sglang-0")]
        assert states == [0.0, 0.0]
        for _ in range(20):
            r = c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200, r.text
        # a long prompt (SGLang's pool) too
        r = c.post("/v1/completions", json={"model": "kimi-k3", "prompt": [1] * 200_000,
                                             "max_tokens": 2048})
        assert r.status_code == 200 and r.headers["x-engine-advisor-engine"] == "sglang"


# ------------------------------------------------------------------ smaller ones
def test_a_non_streamed_request_whose_upstream_never_answers_gets_a_504(stack):
    srv = stack["serve"]
    t = time.monotonic()
    r = httpx.post(srv.url + "/v1/chat/completions", json=CHAT, headers={"x-hang": "1"},
                   timeout=60)
    waited = time.monotonic() - t
    assert r.status_code == 504, r.text
    assert "no answer within 1.5 s" in r.json()["error"]["message"]
    assert 1.4 <= waited < 20
    still_serving(srv.url)
