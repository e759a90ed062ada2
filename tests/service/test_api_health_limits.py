"""Health, readiness, metrics, request ids and the request-body cap (in-process)."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from fastapi.testclient import TestClient
from svc_helpers import SEED, assert_error, make_client

from engine_advisor.service.main import create_app
from engine_advisor.service.settings import Settings


def test_healthz_and_readyz(client):
    assert client.get("/healthz").json() == {"status": "ok", "model_version": None}
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["model_version"].startswith("default-")


def test_not_ready_before_the_model_is_loaded():
    c = TestClient(create_app(Settings(_env_file=None)), raise_server_exceptions=False)
    # no lifespan run: nothing loaded yet
    assert_error(c.get("/readyz"), 503, contains="not loaded")
    assert_error(c.post("/v1/recommend", json=SEED), 503)
    assert c.get("/healthz").status_code == 200


def test_metrics_by_route_template_and_engine():
    with make_client() as c:
        c.post("/v1/recommend", json=SEED)
        c.post("/v1/recommend", json={**SEED, "context_tokens": 65_536})
        c.post("/v1/recommend", json={**SEED, "context_tokens": 0})
        for i in range(20):
            c.get(f"/no/such/path/{i}")
        text = c.get("/metrics").text
    series = 'engine_advisor_http_requests_total{method="POST",route="/v1/recommend",status='
    assert series + '"200"} 2.0' in text
    assert series + '"422"} 1.0' in text
    assert 'engine_advisor_recommendations_total{dcp_size="8",engine="sglang"} 1.0' in text
    assert 'engine_advisor_recommendations_total{dcp_size="1",engine="vllm"} 1.0' in text
    assert ('engine_advisor_http_request_duration_seconds_bucket{le="0.5",method="POST",'
            'route="/v1/recommend",status="200"}') in text
    assert 'engine_advisor_model_info{source="embedded default' in text
    # raw paths never become labels: 20 different unknown paths share one series
    assert 'route="unmatched",status="404"} 20.0' in text
    assert "/no/such/path" not in text


@pytest.mark.parametrize("sent, echoed", [
    ("abc-123_X.y:z", True),
    ("a" * 128, True),
    ("a" * 129, False),
    ("has space", False),
    ("<script>", False),
    ("x\tinjected: 1", False),
])
def test_request_id_echo_only_when_safe(client, sent, echoed):
    r = client.get("/healthz", headers={"X-Request-Id": sent})
    rid = r.headers["x-request-id"]
    assert (rid == sent) is echoed
    assert re.fullmatch(r"[A-Za-z0-9._:\-]{1,128}", rid)
    assert "injected" not in r.headers


def test_unexpected_errors_use_the_envelope():
    from fastapi import APIRouter

    app = create_app(Settings(_env_file=None))
    boom = APIRouter()

    @boom.get("/boom")
    async def explode():
        raise RuntimeError("secret internals")

    app.include_router(boom)
    with TestClient(app, raise_server_exceptions=False) as c:
        err = assert_error(c.get("/boom"), 500, contains="internal error")
        assert "secret" not in err["message"] and err["type"] == "server_error"
        assert 'route="/boom",status="500"} 1.0' in c.get("/metrics").text


def test_request_id_created_when_absent_and_on_errors(client):
    a = client.get("/healthz").headers["x-request-id"]
    b = client.post("/v1/recommend", json={}).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", a) and re.fullmatch(r"[0-9a-f]{32}", b) and a != b


def test_body_cap_by_content_length():
    with make_client(max_body_bytes=200) as c:
        assert c.post("/v1/recommend", json=SEED).status_code == 200
        big = {**SEED, "model": "m" * 250}
        err = assert_error(c.post("/v1/recommend", json=big), 413, contains="limit is 200 bytes")
        assert err["type"] == "request_too_large"


def test_body_cap_on_a_streamed_body():
    with make_client(max_body_bytes=200) as c:
        payload = json.dumps({**SEED, "model": "m" * 250}).encode()

        def chunks():  # no Content-Length: sent chunked
            for i in range(0, len(payload), 64):
                yield payload[i:i + 64]

        r = c.post("/v1/recommend", content=chunks(), headers={"content-type": "application/json"})
        assert_error(r, 413, contains="more than 200 bytes")


def test_body_cap_when_content_length_lies():
    app = create_app(Settings(_env_file=None, max_body_bytes=100))
    payload = json.dumps({**SEED, "model": "m" * 250}).encode()

    async def go():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as ac:
                return await ac.post("/v1/recommend", content=payload,
                                     headers={"content-type": "application/json",
                                              "content-length": "50"})

    import asyncio
    assert_error(asyncio.run(go()), 413)


def test_bad_content_length(client):
    r = client.post("/v1/recommend", content=b"{}", headers={"content-length": "abc",
                                                             "content-type": "application/json"})
    assert_error(r, 400, param="content-length")


@pytest.mark.parametrize("method, path", [
    ("POST", "/healthz"), ("DELETE", "/readyz"), ("POST", "/metrics"), ("POST", "/v1/model"),
    ("PUT", "/v1/model"), ("GET", "/v1/model/reload"), ("GET", "/v1/plan"),
    ("GET", "/v1/predict"), ("GET", "/v1/crossover"), ("GET", "/v1/recommend/batch"),
])
def test_wrong_methods_get_405_envelopes(client, method, path):
    assert_error(client.request(method, path), 405)


@pytest.mark.parametrize("path", ["/healthz/", "/v1/model/x", "/v2/recommend"])
def test_unknown_paths_get_404_envelopes(client, path):
    r = client.get(path, follow_redirects=False)
    if r.status_code == 307:  # trailing-slash redirect to the real route
        assert r.headers["location"].endswith("/healthz")
    else:
        assert_error(r, 404)
