"""What outlives a crash, and what cannot run code: real processes on loopback.

- ``serve --data-dir``: observations SIGKILLed with the process come back when it starts
  again (the file is written every second and fsynced); the file is a dataset CSV that
  ``fit`` reads; it is rotated, so it stays bounded.
- A crafted artifact (a pickle whose unpickling writes a marker, put in place of the JSON
  document, of the ``.npz``, or of an old ``.joblib``) is refused by ``serve --model``,
  ``POST /v1/model/reload``, ``recommend --model`` and ``sim --model``; the marker is never
  written.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import time

import httpx
import pytest
from calib_helpers import BIN
from proc import wait_for
from rel_helpers import AUTH, TOKEN, Proc, serve_proc, start_all
from svc_helpers import fit_artifact

from engine_advisor.model.fit.artifact import arrays_path, content_sha256
from engine_advisor.model.fit.dataset import parse_csv
from engine_advisor.service.proxy.obsfile import FILE, ROW_BYTES

pytestmark = pytest.mark.timeout(240)

CHAT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def sims():
    procs = start_all(Proc("sim", "--engine", "vllm", "--time-scale", "0.001"),
                      Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale",
                           "0.001"))
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()


def observed(url: str) -> list:
    r = httpx.get(url + "/v1/observations", headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return parse_csv(r.text)


def _rows(path) -> int:
    if not path.exists():
        return 0
    text = path.read_text()
    return len(parse_csv(text[: text.rfind("\n") + 1])) if text.strip() else 0


def test_observations_survive_sigkill(sims, tmp_path):
    """Before: all lost (memory only, and the docs did not say so)."""
    data = tmp_path / "data"
    srv = serve_proc(tmp_path, sims[:1], sims[1:])
    srv.args += ["--data-dir", str(data)]
    start_all(srv)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for i in range(40):
                r = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": 4 + i % 3},
                           headers={"x-request-id": f"obs-{i}"})
                assert r.status_code == 200, r.text
        before = observed(srv.url)
        assert len(before) == 40
        # written within a second (FLUSH_S), then the crash
        assert wait_for(lambda: _rows(data / FILE) == 40, timeout=30, step=0.1)
        srv.kill()
    finally:
        srv.stop()
    again = serve_proc(tmp_path, sims[:1], sims[1:])
    again.args += ["--data-dir", str(data)]
    start_all(again)
    try:
        after = observed(again.url)
        assert [m.model_dump() for m in after] == [m.model_dump() for m in before]
        r = httpx.post(again.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 200
        assert len(observed(again.url)) == 41
    finally:
        again.stop()                      # graceful: the last row is flushed on the way out
    assert _rows(data / FILE) == 41
    # the file is a calibration dataset as it is (--force: the simulator's timing, scaled
    # down, beats the physics, which fit refuses by itself)
    fit = subprocess.run([str(BIN), "fit", "--force", str(data / FILE), "--out",
                          str(tmp_path / "fit.json")], capture_output=True, text=True,
                         timeout=120)
    assert fit.returncode == 0, fit.stderr


def test_the_observations_file_is_rotated_and_reloads_the_last_rows(sims, tmp_path):
    data = tmp_path / "data"
    srv = serve_proc(tmp_path, sims[:1], sims[1:], observations=5)
    srv.args += ["--data-dir", str(data)]
    start_all(srv)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for i in range(60):
                assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
                if i % 10 == 9:           # several flushes (one a second)
                    time.sleep(1.2)
        kept = observed(srv.url)
        assert len(kept) == 5
    finally:
        srv.stop()
    files = sorted(p.name for p in data.iterdir())
    assert files == [FILE, FILE + ".1"]
    total = _rows(data / FILE) + _rows(data / (FILE + ".1"))
    assert 5 <= total < 60                # bounded: the oldest rows were dropped
    for p in data.iterdir():              # ROW_BYTES per row kept, or one flush's rows
        assert p.stat().st_size <= max(5 * ROW_BYTES, 200 + 10 * ROW_BYTES)
    again = serve_proc(tmp_path, sims[:1], sims[1:], observations=5)
    again.args += ["--data-dir", str(data)]
    start_all(again)
    try:
        assert [m.model_dump() for m in observed(again.url)] == \
            [m.model_dump() for m in kept]
    finally:
        again.stop()


def test_a_torn_last_line_is_skipped_at_start(sims, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    srv = serve_proc(tmp_path, sims[:1], sims[1:])
    srv.args += ["--data-dir", str(data)]
    start_all(srv)
    try:
        assert httpx.post(srv.url + "/v1/chat/completions", json=CHAT,
                          timeout=30).status_code == 200
    finally:
        srv.stop()
    with open(data / FILE, "a") as f:
        f.write("vllm,,B300,8,1,0.92,500")            # a crash in the middle of a write
    again = serve_proc(tmp_path, sims[:1], sims[1:])
    again.args += ["--data-dir", str(data)]
    start_all(again)
    try:
        assert len(observed(again.url)) == 1
    finally:
        log = again.log
        again.stop()
    assert "torn by a crash" in log and "Traceback" not in log


# ------------------------------------------------------------------ artifacts are data
class Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def crafted(tmp_path, where: str) -> tuple:
    """(the artifact path to load, the marker its unpickling would create)."""
    marker = tmp_path / f"pwned-{where}"
    payload = pickle.dumps(Payload(str(marker)), protocol=4)
    d = tmp_path / f"models-{where}"
    d.mkdir()
    path = d / "m.json"
    fit_artifact(path)
    if where == "document":
        path.write_bytes(payload)
    elif where == "arrays":
        arrays_path(path).write_bytes(payload)
        doc = json.loads(path.read_text())
        import hashlib
        doc["arrays_sha256"] = hashlib.sha256(payload).hexdigest()
        doc["artifact_sha256"] = content_sha256(doc["model"], doc["arrays_sha256"])
        path.write_text(json.dumps(doc))
    else:                                    # an old joblib artifact with its metadata
        path = d / "m.joblib"
        path.write_bytes(payload)
        (d / "m.joblib.json").write_text(json.dumps({"schema_version": 2}))
    return path, marker


WHERE = ["document", "arrays", "joblib"]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("command", [
    ["serve", "--port", "0", "--model"],
    ["recommend", "--context-tokens", "65536", "--output-tokens", "8",
     "--kv-bytes-per-token", "70272", "--model"],
    ["sim", "--engine", "vllm", "--port", "9", "--model"],
])
def test_a_crafted_artifact_cannot_run_code_from_the_command_line(tmp_path, where, command):
    path, marker = crafted(tmp_path, where)
    r = subprocess.run([str(BIN), *command, str(path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "error:" in r.stderr and "Traceback" not in r.stderr
    assert ("model convert" in r.stderr) == (where != "arrays"), r.stderr
    assert not marker.exists()


def test_a_crafted_artifact_cannot_run_code_through_reload(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    fit_artifact(models / "good.json")
    markers = []
    for where in WHERE:
        path, marker = crafted(tmp_path, where)
        for f in path.parent.iterdir():
            (models / f"{where}-{f.name}").write_bytes(f.read_bytes())
        markers.append((f"{where}-{path.name}", marker))
    srv = Proc("serve", "--models-dir", str(models), "--log-level", "warning", ready="/readyz",
               env={"ENGINE_ADVISOR_ADMIN_TOKEN": TOKEN})
    start_all(srv)
    try:
        with httpx.Client(base_url=srv.url, timeout=30, headers=AUTH) as c:
            before = c.get("/v1/model").json()["model_version"]
            for name, marker in markers:
                r = c.post("/v1/model/reload", json={"path": name})
                assert r.status_code == 422, r.text
                assert "still serving" in r.json()["error"]["message"]
                assert not marker.exists()
            assert c.get("/v1/model").json()["model_version"] == before
            ok = c.post("/v1/model/reload", json={"path": "good.json"})
            assert ok.status_code == 200, ok.text
    finally:
        log = srv.log
        srv.stop()
    assert "Traceback" not in log
