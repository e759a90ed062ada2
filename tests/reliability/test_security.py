"""Security: admin and client tokens, secrets never echoed, request paths never opened,
request ids that cannot inject headers.

The stack: ``engine-advisor serve`` (admin token, models folder, client API keys) whose vLLM
pool is a small recording HTTP server in this process (it shows what the proxy sends
upstream) and whose SGLang pool is a simulator process.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from rel_helpers import Proc, serve_proc, start_all
from svc_helpers import SEED, fit_artifact

from engine_advisor.service.main import create_app
from engine_advisor.service.settings import Settings

pytestmark = pytest.mark.timeout(120)

ADMIN = "adm-9f8e7d6c5b4a-secret"
CLIENT = "cli-1a2b3c4d5e6f-secret"
UPSTREAM = "ups-0a9b8c7d6e5f-secret"
SECRETS = (ADMIN, CLIENT, UPSTREAM)
SAFE_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
CHAT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
ADMIN_ROUTES = [("POST", "/v1/model/reload"), ("GET", "/v1/upstreams"),
                ("POST", "/v1/upstreams/reload"), ("GET", "/v1/observations")]
CLIENT_ROUTES = [("POST", "/v1/chat/completions", CHAT),
                 ("POST", "/v1/completions", {"model": "kimi-k3", "prompt": "hi",
                                              "max_tokens": 4}),
                 ("GET", "/v1/models", None),
                 ("POST", "/v1/route", {"context_tokens": 1000})]


class Recorder(BaseHTTPRequestHandler):
    """A minimal OpenAI-compatible upstream that records the headers it receives."""

    seen: list[dict[str, str]] = []

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer(200, {"status": "ok"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        Recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        self._answer(200, {"id": "x", "object": "chat.completion", "created": 0,
                           "model": "kimi-k3", "usage": usage,
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": "ok"}}]})


@pytest.fixture(scope="module")
def recorder():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def secure(tmp_path_factory, recorder):
    tmp = tmp_path_factory.mktemp("secure")
    (tmp / "models").mkdir()
    fit_artifact(tmp / "models" / "good.json")
    sg = Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale", "0.001")
    srv = serve_proc(tmp, [], [sg], client_api_keys=[CLIENT],
                     env={"ENGINE_ADVISOR_MODELS_DIR": str(tmp / "models"),
                          "ENGINE_ADVISOR_ADMIN_TOKEN": ADMIN})
    path = tmp / "upstreams.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["pools"]["vllm"] = [{"url": recorder, "model": "kimi-k3", "dcp_size": 1,
                             "api_key": UPSTREAM}]
    path.write_text(yaml.safe_dump(doc))
    procs = start_all(sg, srv)
    try:
        yield {"url": srv.url, "proc": srv, "path": path, "sglang": sg}
    finally:
        for p in procs:
            p.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def call(url: str, method: str, path: str, body=None, headers=None) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.request(method, url + path, content=body, timeout=30, headers={
            "content-type": "application/json", **(headers or {})})
    return httpx.request(method, url + path, json=body, headers=headers, timeout=30)


def assert_no_secrets(r: httpx.Response) -> None:
    blob = r.content + b"\n".join(k + b": " + v for k, v in r.headers.raw)
    for s in SECRETS:
        assert s.encode() not in blob, (s, r.text)
        assert s[:12].encode() not in blob, (s, r.text)
    assert b"Traceback" not in blob


# ------------------------------------------------------------------ tokens and keys
@pytest.mark.parametrize("method, path", ADMIN_ROUTES)
def test_admin_routes_refuse_missing_and_invalid_tokens(secure, method, path):
    url = secure["url"]
    for headers, status in [(None, 401), ({"Authorization": "Basic " + ADMIN}, 401),
                            ({"Authorization": "Bearer"}, 401), (bearer("wrong"), 403),
                            (bearer(ADMIN + "x"), 403), (bearer(ADMIN[:-1]), 403),
                            (bearer(CLIENT), 403)]:
        r = call(url, method, path, headers=headers)
        assert r.status_code == status, (headers, r.text)
        err = r.json()["error"]
        assert err["param"] == "authorization" and err["code"] == status
        if status == 401:
            assert r.headers["www-authenticate"] == "Bearer"
        assert_no_secrets(r)
    ok = call(url, method, path, body={"path": "good.json"} if "model" in path else None,
              headers=bearer(ADMIN))
    assert ok.status_code == 200, ok.text
    assert_no_secrets(ok)


def test_admin_routes_are_disabled_without_a_configured_token(secure):
    settings = Settings(_env_file=None, upstreams=secure["path"], upstreams_watch_s=0)
    from fastapi.testclient import TestClient
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        for method, path in ADMIN_ROUTES:
            r = c.request(method, path, headers=bearer(ADMIN))
            assert r.status_code == 403 and "disabled" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("method, path, body", CLIENT_ROUTES, ids=[r[1] for r in CLIENT_ROUTES])
def test_client_api_keys_are_enforced(secure, method, path, body):
    url = secure["url"]
    for headers, word in [(None, "missing"), (bearer("nope"), "invalid"),
                          (bearer(ADMIN), "invalid"), (bearer(CLIENT[:-1]), "invalid"),
                          ({"Authorization": CLIENT}, "missing")]:
        r = call(url, method, path, body, headers)
        assert r.status_code == 401, (headers, r.text)
        assert word in r.json()["error"]["message"] and r.headers["www-authenticate"] == "Bearer"
        assert_no_secrets(r)
    ok = call(url, method, path, body, bearer(CLIENT))
    assert ok.status_code == 200, ok.text
    assert_no_secrets(ok)


def test_the_upstream_gets_its_own_key_never_the_clients(secure):
    Recorder.seen.clear()
    r = call(secure["url"], "POST", "/v1/chat/completions", CHAT,
             {**bearer(CLIENT), "Proxy-Authorization": "Basic " + CLIENT})
    assert r.status_code == 200 and r.headers["x-engine-advisor-upstream"] == "vllm-0"
    (headers,) = Recorder.seen
    assert headers["authorization"] == f"Bearer {UPSTREAM}"
    assert CLIENT not in json.dumps(headers) and ADMIN not in json.dumps(headers)
    assert_no_secrets(r)


# ------------------------------------------------------------------ nothing echoed
def test_errors_and_pages_never_echo_secrets_or_tracebacks(secure):
    url, path = secure["url"], secure["path"]
    responses = [
        call(url, "GET", "/v1/upstreams", headers=bearer(ADMIN)),
        call(url, "GET", "/metrics"),
        call(url, "GET", "/v1/model"),
        call(url, "GET", "/v1/observations", headers=bearer(ADMIN)),
        call(url, "POST", "/v1/recommend", {**SEED, "preset": "x"}),
        call(url, "POST", "/v1/recommend", {**SEED, "gpu": "x"}),
        call(url, "POST", "/v1/recommend", b"{not json"),
        call(url, "POST", "/v1/chat/completions", {**CHAT, "model": "x"}, bearer(CLIENT)),
        call(url, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 10**9}, bearer(CLIENT)),
        call(url, "POST", "/v1/completions", {"prompt": 5}, bearer(CLIENT)),
        call(url, "POST", "/v1/model/reload", {"path": "../x"}, bearer(ADMIN)),
        call(url, "POST", "/v1/model/reload", {"path": "nope.json"}, bearer(ADMIN)),
        call(url, "GET", "/v1/nope"),
    ]
    good = path.read_text()
    doc = yaml.safe_load(good)
    try:
        # broken pools files that hold the secrets: the refusal names the field, not the value
        for broken in [good.replace(f"api_key: {UPSTREAM}", f"api_key: [{UPSTREAM}, {{]"),
                       good.replace(f"- {CLIENT}", f"- {{key: {CLIENT}}}"),
                       yaml.safe_dump({**doc, "client_api_keys": [CLIENT, 5, None]}),
                       yaml.safe_dump({**doc, "admin_token": ADMIN})]:
            assert broken != good
            path.write_text(broken)
            r = call(url, "POST", "/v1/upstreams/reload", headers=bearer(ADMIN))
            assert r.status_code == 422, r.text
            responses.append(r)
        responses.append(call(url, "GET", "/v1/upstreams", headers=bearer(ADMIN)))
    finally:
        path.write_text(good)
        assert call(url, "POST", "/v1/upstreams/reload",
                    headers=bearer(ADMIN)).status_code == 200
    for r in responses:
        assert_no_secrets(r)
    log = secure["proc"].log
    for s in SECRETS:
        assert s not in log and s[:12] not in log
    assert "Traceback" not in log


# ------------------------------------------------------------------ no request path opened
CANARY = "canary-7c1d2f"


def test_no_file_path_from_a_request_is_opened(secure, tmp_path):
    """Every file the service opens while answering requests full of paths (an audit hook
    sees each open), in process; only the operator-allowed artifact may be opened."""
    models = tmp_path / "models"
    models.mkdir()
    fit_artifact(models / "good.json")
    secret_dir = tmp_path / CANARY
    secret_dir.mkdir()
    (secret_dir / "x.json").write_bytes(b"not a model")
    (secret_dir / "x.npz").write_text("{}")
    paths = [str(secret_dir / "x.json"), f"../{CANARY}/x.json", "/etc/passwd",
             f"../../../../../../etc/passwd#{CANARY}", f"file://{secret_dir}/x.json"]
    opened: list[str] = []
    recording = threading.Event()

    def hook(event: str, args: tuple) -> None:
        if recording.is_set() and event == "open" and isinstance(args[0], str | bytes | Path):
            opened.append(str(args[0]))

    sys.addaudithook(hook)      # process-wide and permanent: gated by ``recording``
    settings = Settings(_env_file=None, upstreams=secure["path"], upstreams_watch_s=0,
                        admin_token=ADMIN, models_dir=models)
    from fastapi.testclient import TestClient
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        recording.set()
        try:
            statuses = []
            for p in paths:
                for method, route, body in [
                        ("POST", "/v1/model/reload", {"path": p}),
                        ("POST", "/v1/recommend", {**SEED, "model": p.lstrip("/")}),
                        ("POST", "/v1/recommend", {**SEED, "kv_bytes_per_token": None,
                                                   "preset": p}),
                        ("POST", "/v1/recommend", {**SEED, "gpu": p}),
                        ("POST", "/v1/recommend", {**SEED, "kv_bytes_per_token": None,
                                                   "hf_config": {"_name_or_path": p,
                                                                 "tokenizer_file": p}}),
                        ("POST", "/v1/chat/completions", {**CHAT, "model": p}),
                        ("POST", "/v1/chat/completions", {**CHAT, "messages": [
                            {"role": "user", "content": [{"type": "file", "file": p},
                                                         {"type": "image_url",
                                                          "image_url": {"url": p}}]}]}),
                        ("POST", "/v1/completions", {"model": "kimi-k3", "prompt": p,
                                                     "max_tokens": 2}),
                        ("POST", "/v1/route", {"model": p, "context_tokens": 1000}),
                        ("GET", f"/v1/model?path={p}", None),
                        ("GET", f"/{p}", None)]:
                    r = c.request(method, route, json=body,
                                  headers={**bearer(ADMIN), **bearer(CLIENT)}
                                  if "completions" not in route and "route" not in route
                                  else bearer(CLIENT))
                    statuses.append(r.status_code)
                    assert r.status_code < 500, (route, body, r.text)
            allowed = c.post("/v1/model/reload", json={"path": "good.json"},
                             headers=bearer(ADMIN))
            assert allowed.status_code == 200, allowed.text
        finally:
            recording.clear()
    assert any(s == 403 for s in statuses) and any(s == 200 for s in statuses)
    assert not [o for o in opened if CANARY in o or "passwd" in o], opened
    assert any(o.endswith("good.json") for o in opened)     # the hook does see opens


# ------------------------------------------------------------------ request ids
def raw_request(url: str, head: bytes, body: bytes = b"") -> tuple[int, list[tuple[str, str]]]:
    """Send raw bytes (no client-side header checks); (status, response headers)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    lines = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    return status, [tuple(x.strip() for x in ln.split(":", 1)) for ln in lines[1:] if ":" in ln]


@pytest.mark.parametrize("path, body", [("/v1/recommend", SEED), ("/v1/chat/completions", CHAT)],
                         ids=["service", "proxy"])
@pytest.mark.parametrize("rid", [
    b"abc%0d%0aSet-Cookie:%20evil=1", b"abc\rSet-Cookie: evil=1", b"abc\r\n Set-Cookie: evil=1",
    b"abc\nSet-Cookie: evil=1", b"x" * 5000, "caf\u00e9-\u2028".encode(), b"abc def", b"",
    b"a\x00b"], ids=["pct-crlf", "bare-cr", "obs-fold", "bare-lf", "long", "non-ascii", "space",
                     "empty", "nul"])
def test_request_ids_cannot_inject_headers(secure, path, body, rid):
    data = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {CLIENT}\r\nContent-Length: {len(data)}\r\n"
            f"Connection: close\r\n").encode() + b"X-Request-Id: " + rid + b"\r\n\r\n"
    status, headers = raw_request(secure["url"], head, data)
    names = [k.lower() for k, _ in headers]
    assert "set-cookie" not in names and not any("evil" in v for _, v in headers)
    if status == 200:
        (got,) = [v for k, v in headers if k.lower() == "x-request-id"]
        assert SAFE_ID.fullmatch(got) and got.encode() != rid
    else:
        assert status == 400       # the HTTP parser refused the request outright


def test_a_safe_request_id_is_echoed_once(secure):
    for path, body in [("/v1/recommend", SEED), ("/v1/chat/completions", CHAT)]:
        r = call(secure["url"], "POST", path, body,
                 {**bearer(CLIENT), "X-Request-Id": "trace-42.a:b"})
        assert r.status_code == 200
        assert r.headers.get_list("x-request-id") == ["trace-42.a:b"]
