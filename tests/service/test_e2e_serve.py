"""End to end: ``engine-advisor serve`` as a real process on a free loopback port, httpx."""

from __future__ import annotations

import json
import shutil
import subprocess

import httpx
import pytest
import seedload
from proc import EXE
from svc_helpers import SEED, TOKEN, assert_error, fit_artifact, serve

pytestmark = pytest.mark.timeout(120)


def cli_recommend(context: int) -> dict:
    out = subprocess.run(
        [str(EXE), "recommend", "--context-tokens", str(context), *seedload.CLI, "--json"],
        capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def server():
    s = serve().start()
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("context, engine, dcp", [(65_536, "vllm", 1), (204_800, "sglang", 8)])
def test_http_answer_equals_cli_json(server, context, engine, dcp):
    r = httpx.post(f"{server.url}/v1/recommend", json={**SEED, "context_tokens": context})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert (body["engine"], body["dcp_size"], body["mem_fraction"]) == (engine, dcp, 0.92)
    assert body == cli_recommend(context)


def test_every_endpoint_over_the_socket(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        no_ctx = {k: v for k, v in SEED.items() if k != "context_tokens"}
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").json()["status"] == "ready"
        batch = c.post("/v1/recommend/batch", json={"workloads": [SEED, {}]}).json()
        assert (batch["succeeded"], batch["failed"]) == (1, 1)
        p = c.post("/v1/predict", json={"workload": SEED, "engine": "sglang", "dcp_size": 8})
        assert p.status_code == 200 and p.json()["prediction"]["calibrated"]
        x = c.post("/v1/crossover", json=no_ctx).json()
        assert x["engine_crossovers"][0]["after"]["engine"] == "sglang"
        plan = c.post("/v1/plan", json={
            "classes": [{"context_tokens": 65536, "output_tokens": 2048,
                         "requests_per_second": 1}],
            "kv_bytes_per_token": 70272, "slo": {"max_tpot_s": 0.05}}).json()
        assert plan["total_nodes"] >= 1
        assert c.get("/v1/model").json()["model_version"].startswith("default-")
        assert_error(c.post("/v1/model/reload", json={}), 403, contains="disabled")
        r = c.get("/healthz", headers={"X-Request-Id": "trace-42"})
        assert r.headers["x-request-id"] == "trace-42"
        metrics = c.get("/metrics").text
        assert 'route="/v1/recommend/batch",status="200"' in metrics


def test_streamed_oversized_body_gets_413(server):
    def chunks():
        yield b'{"context_tokens": 1, "model": "'
        for _ in range(40):
            yield b"m" * 32768
        yield b'"}'

    r = httpx.post(f"{server.url}/v1/recommend", content=chunks(),
                   headers={"content-type": "application/json"}, timeout=30)
    assert_error(r, 413, contains="limit is 1,048,576 bytes")


def test_reload_in_a_real_process(start_server, tmp_path):
    models = tmp_path / "models"
    fit_artifact(models / "a.json")
    fit_artifact(models / "b.json", drop_last=1)
    s = start_server("--model", str(models / "a.json"), "--models-dir", str(models),
                     env={"ENGINE_ADVISOR_ADMIN_TOKEN": TOKEN})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=s.url, timeout=30) as c:
        v_a = c.get("/v1/model").json()["model_version"]
        assert_error(c.post("/v1/model/reload", json={"path": "b.json"}), 401)
        assert_error(c.post("/v1/model/reload", json={"path": "b.json"},
                            headers={"Authorization": "Bearer wrong"}), 403)
        r = c.post("/v1/model/reload", json={"path": "b.json"}, headers=auth)
        assert r.status_code == 200, r.text
        v_b = r.json()["model_version"]
        assert v_b != v_a
        assert c.post("/v1/recommend", json=SEED).json()["model_version"] == v_b
        shutil.copy(models / "a.json", models / "c.json")
        (models / "c.npz").write_bytes(b"not the arrays the metadata pins")
        assert_error(c.post("/v1/model/reload", json={"path": "c.json"}, headers=auth), 422,
                     contains="sha256")
        assert c.post("/v1/recommend", json=SEED).json()["model_version"] == v_b


def test_serve_refuses_bad_options():
    for args, text in ((["--port", "70000"], "--port"), (["--model", "/no/such.json"],
                                                          "no such file"),
                       (["--workers", "0"], "--workers")):
        r = subprocess.run([str(EXE), "serve", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r
        assert r.stderr.startswith("engine-advisor: error:") and text in r.stderr


def test_openapi_command_writes_the_document(tmp_path):
    from engine_advisor.service.openapi import openapi_yaml

    out = tmp_path / "openapi.yaml"
    r = subprocess.run([str(EXE), "openapi", "--out", str(out)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert out.read_text(encoding="utf-8") == openapi_yaml()
