"""GET /v1/model and POST /v1/model/reload (in-process)."""

from __future__ import annotations

import shutil

import pytest
from svc_helpers import SEED, TOKEN, assert_error, fit_artifact, make_client

from engine_advisor.model.fit.artifact import arrays_path
from engine_advisor.model.fit.default import default_model

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_model_metadata_of_the_default(client):
    r = client.get("/v1/model")
    assert r.status_code == 200
    body = r.json()
    assert body["model_version"].startswith("default-")
    assert body["artifact_sha256"] is None and "embedded" in body["source"]
    assert len(body["training_data_sha256"]) == 64
    assert body["engines"] == ["sglang", "vllm"]
    m = default_model()
    assert body["model_version"] == m.version
    assert body["training_data_sha256"] == m.data_sha256
    # the published runs: vLLM without DCP and SGLang with DCP 8, at 64K and 200K tokens
    (served, rng), = body["calibrated_ranges"]["vllm/B300/8/1"].items()   # Kimi-K3 only
    assert served.startswith("kimi-k3@")
    lo, hi = rng["context_tokens"]
    assert lo <= 65_536 and hi >= 204_800
    assert body["calibrated_ranges"] == m.ranges
    assert body["calibrated_points"]["sglang/B300/8/8"] >= 2
    # per engine: each GPU family's pooled level and each GPU's (engine_advisor.model.fit.fitting)
    assert set(body["fit_metrics"]) == set(body["efficiencies"]) == {
        f"{e}/{level}" for e in ("vllm", "sglang")
        for level in ("B300", "@blackwell", "H200", "@hopper")}
    assert body["efficiencies"]["sglang/B300"]["dcp_comm"] == pytest.approx(1.0, rel=0.01)
    assert body["hardware"]["B300"]["kv_read"] == "profile:b300.json"
    assert 0.95 in body["memory_fractions"]["vllm/B300"]["unsafe"]
    assert body["sources"]


def test_admin_disabled_without_token(client):
    assert_error(client.post("/v1/model/reload", headers=AUTH), 403, contains="disabled")


@pytest.fixture
def admin(artifact_dir, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for f in ("good.json", "good.npz"):
        shutil.copy(artifact_dir / f, models / f)
    with make_client(admin_token=TOKEN, models_dir=models) as c:
        yield c, models


def test_missing_or_wrong_token(admin):
    c, _ = admin
    r = c.post("/v1/model/reload", json={"path": "good.json"})
    assert_error(r, 401, param="authorization", contains="bearer")
    assert r.headers["www-authenticate"] == "Bearer"
    assert_error(c.post("/v1/model/reload", json={"path": "good.json"},
                        headers={"Authorization": "Bearer nope"}), 403, contains="invalid")
    assert_error(c.post("/v1/model/reload", json={"path": "good.json"},
                        headers={"Authorization": f"Basic {TOKEN}"}), 401)
    assert c.get("/v1/model").json()["model_version"].startswith("default-")


def test_good_artifact_swaps_in_and_cache_follows(admin):
    c, models = admin
    before = c.post("/v1/recommend", json=SEED).json()
    old = c.get("/v1/model").json()["model_version"]
    fit_artifact(models / "smaller.json", drop_last=1)
    r = c.post("/v1/model/reload", json={"path": "smaller.json"}, headers=AUTH)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["previous_version"] == old and body["model_version"] != old
    info = c.get("/v1/model").json()
    assert info["model_version"] == body["model_version"]
    assert info["artifact_sha256"].startswith(body["model_version"])
    after = c.post("/v1/recommend", json=SEED).json()
    assert after["model_version"] == body["model_version"] != before["model_version"]
    assert 'engine_advisor_model_info{source=' in c.get("/metrics").text
    assert body["model_version"] in c.get("/metrics").text


def test_tampered_artifact_is_refused_and_old_model_keeps_answering(admin):
    c, models = admin
    ok = c.post("/v1/model/reload", json={"path": str(models / "good.json")}, headers=AUTH)
    assert ok.status_code == 200
    good = ok.json()["model_version"]
    shutil.copy(models / "good.json", models / "bad.json")
    shutil.copy(arrays_path(models / "good.json"), arrays_path(models / "bad.json"))
    data = bytearray(arrays_path(models / "bad.json").read_bytes())
    data[len(data) // 2] ^= 0xFF
    arrays_path(models / "bad.json").write_bytes(bytes(data))
    err = assert_error(c.post("/v1/model/reload", json={"path": "bad.json"}, headers=AUTH),
                       422, param="path", contains="sha256")
    assert err["type"] == "invalid_artifact" and good in err["message"]
    assert c.get("/v1/model").json()["model_version"] == good
    r = c.post("/v1/recommend", json=SEED)
    assert r.status_code == 200 and r.json()["model_version"] == good
    assert 'engine_advisor_model_reloads_total{result="failed"} 1.0' in c.get("/metrics").text


@pytest.mark.parametrize("path, status, contains", [
    ("/etc/passwd", 403, "not allowed"),
    ("../outside.json", 403, "not allowed"),
    (".", 403, "not allowed"),
    ("missing.json", 422, "no such file"),
    ("good\u0000.json", 422, "NUL"),
])
def test_reload_paths_outside_the_allowed_set(admin, path, status, contains):
    c, _ = admin
    assert_error(c.post("/v1/model/reload", json={"path": path}, headers=AUTH), status,
                 param="path", contains=contains)
    assert c.get("/v1/model").json()["model_version"].startswith("default-")


def test_symlink_out_of_models_dir_is_refused(admin, tmp_path):
    c, models = admin
    outside = tmp_path / "elsewhere.json"
    fit_artifact(outside)
    (models / "link.json").symlink_to(outside)
    assert_error(c.post("/v1/model/reload", json={"path": "link.json"}, headers=AUTH), 403)


def test_reload_without_path_uses_configured_model_path(artifact_dir):
    path = artifact_dir / "good.json"
    with make_client(admin_token=TOKEN, model_path=path) as c:
        v = c.get("/v1/model").json()["model_version"]
        assert not v.startswith("default-")
        r = c.post("/v1/model/reload", headers=AUTH)
        assert r.status_code == 200 and r.json()["model_version"] == v
        assert r.json()["source"] == str(path)
    with make_client(admin_token=TOKEN) as c:
        assert_error(c.post("/v1/model/reload", headers=AUTH), 422, param="path",
                     contains="no model_path")
        assert_error(c.post("/v1/model/reload", json={"path": str(path)}, headers=AUTH), 403)


def test_reload_body_validation(admin):
    c, _ = admin
    assert_error(c.post("/v1/model/reload", json={"path": ""}, headers=AUTH), 422, param="path")
    assert_error(c.post("/v1/model/reload", json={"paht": "x"}, headers=AUTH), 422, param="paht")
    assert_error(c.post("/v1/model/reload", json={"path": 5}, headers=AUTH), 422, param="path")


def _reload_within(c, path: str, seconds: float = 10.0):
    """POST /v1/model/reload of ``path`` in a thread: its response, or a failure if it has
    not answered within ``seconds`` (a reader blocked on a FIFO)."""
    import threading

    box = {}
    t = threading.Thread(target=lambda: box.setdefault(
        "r", c.post("/v1/model/reload", json={"path": path}, headers=AUTH)), daemon=True)
    t.start()
    t.join(seconds)
    return box.get("r")


@pytest.mark.parametrize("kind, words", [
    ("directory", "is a directory"),
    ("fifo", "is not a regular file (a FIFO)"),
])
def test_reload_of_a_directory_or_a_fifo_says_what_it_is(admin, kind, words):
    """A 4xx naming the path and what it is (not "no such file"), without waiting on the
    FIFO; the old model keeps serving."""
    import os

    c, models = admin
    path = models / "odd.json"
    if kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    try:
        r = _reload_within(c, "odd.json")
        assert r is not None, f"reload of a {kind} did not answer: it blocked"
    finally:
        if kind == "fifo":      # let a blocked reader go
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:     # ENXIO: no reader, nothing blocked
                pass
    err = assert_error(r, 422, param="path", contains=words)
    assert str(path) in err["message"] and "no such file" not in err["message"]
    assert "still serving model default-" in err["message"]
    assert c.get("/v1/model").json()["model_version"].startswith("default-")
    assert 'engine_advisor_model_reloads_total{result="failed"} 1.0' in c.get("/metrics").text


@pytest.mark.parametrize("kind, words", [
    ("directory", "its arrays odd.npz is a directory"),
    ("fifo", "its arrays odd.npz is not a regular file (a FIFO)"),
])
def test_reload_whose_arrays_are_a_directory_or_a_fifo(admin, kind, words):
    import os

    c, models = admin
    shutil.copy(models / "good.json", models / "odd.json")
    npz = models / "odd.npz"
    if kind == "directory":
        npz.mkdir()
    else:
        os.mkfifo(npz)
    try:
        r = _reload_within(c, "odd.json")
        assert r is not None, f"reload with arrays a {kind} did not answer: it blocked"
    finally:
        if kind == "fifo":
            try:
                os.close(os.open(npz, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
    assert_error(r, 422, param="path", contains=words)
    assert c.get("/v1/model").json()["model_version"].startswith("default-")
