"""Nothing lost, nothing half-written: artifact writers and calibration sweeps killed with
SIGKILL, and truncated or tampered artifacts.

- ``engine_advisor.model.fit.artifact.save`` killed at every fsync/rename it makes (a child process
  kills itself
  there) and at random times in a loop: the path always loads, as the old model or the new.
- A truncated, bit-flipped or metadata-tampered artifact is refused by ``load``, by
  ``serve --model`` and ``recommend --model`` (exit 2, the reason) and by the admin reload
  (422, the old model keeps serving).
- ``calibrate run`` SIGKILLed at random points ten times in a row, then resumed: every point
  exactly once, every CSV line written parses, the manifest is always whole JSON.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from calib_helpers import BIN, REPO, SimProcs
from svc_helpers import TOKEN, assert_error, fit_artifact, make_client
from test_calibrate_kill import check_exactly_once, command

from engine_advisor.model.fit.artifact import ArtifactError, arrays_path, load, save
from engine_advisor.model.fit.dataset import parse_csv, read_csv

pytestmark = pytest.mark.timeout(180)

AUTH = {"Authorization": f"Bearer {TOKEN}"}

def _save_killed_at(source: str, target: str, k: int, calls) -> None:
    """(A forked child.) Save the model of ``source`` over ``target``, SIGKILLing itself at
    the ``k``-th os.fsync/os.replace call; ``calls`` records the calls made."""
    model, _ = load(source)

    def hook(real, name):
        def wrapped(*a):
            if len(calls) == k:
                os.kill(os.getpid(), signal.SIGKILL)
            calls.append(name)
            return real(*a)
        return wrapped

    os.fsync, os.replace = hook(os.fsync, "fsync"), hook(os.replace, "replace")
    save(model, target)


FORK = multiprocessing.get_context("fork")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two fitted artifacts with different versions: 'old' and 'new'."""
    d = tmp_path_factory.mktemp("artifacts")
    old = fit_artifact(d / "old.json")
    new = fit_artifact(d / "new.json", drop_last=3)
    assert old["model_version"] != new["model_version"]
    # other arrays too, so that the arrays' rename is the switch-over point (with the same
    # arrays the new document alone is the whole new artifact)
    assert old["arrays_sha256"] != new["arrays_sha256"]
    return d, old["model_version"], new["model_version"]


def _resaved(src: Path, tmp: Path) -> str:
    """The version ``save`` gives the model loaded from ``src`` (a loaded model carries its
    version, so its bytes, and the version, differ from the file it came from)."""
    model, _ = load(src)
    return save(model, tmp / f"resaved-{src.name}")["model_version"]


def _install(src: Path, dst: Path) -> None:
    shutil.copy(src, dst)
    shutil.copy(arrays_path(src), arrays_path(dst))


def test_writer_killed_at_each_fsync_and_rename_leaves_a_loadable_model(models, tmp_path):
    d, old, _ = models
    new = _resaved(d / "new.json", tmp_path)
    target = tmp_path / "model.json"
    _install(d / "old.json", target)
    source = str(d / "new.json")
    with FORK.Manager() as manager:
        calls = manager.list()
        p = FORK.Process(target=_save_killed_at, args=(source, str(target), 99, calls))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        calls = list(calls)
    # the document first (written, renamed), then the arrays: two renames, each synced
    assert calls.count("replace") == 2 and calls.count("fsync") >= 4
    second_rename = calls.index("replace", calls.index("replace") + 1)
    seen = []
    for k in range(len(calls) + 1):
        _install(d / "old.json", target)
        p = FORK.Process(target=_save_killed_at, args=(source, str(target), k, []))
        p.start()
        p.join(60)
        assert p.exitcode == (-signal.SIGKILL if k < len(calls) else 0)
        model, meta = load(target)               # never refused
        seen.append(model.version)
        # the arrays' rename is the switch-over point
        assert model.version == (new if k > second_rename else old), (k, calls)
    assert seen[0] == old and seen[-1] == new


def _save_forever(d: str, target: str, saves, took) -> None:
    """(A forked child.) Save the old and the new model over ``target`` in turn, for ever;
    ``saves`` counts the saves completed and ``took`` holds the last one's seconds."""
    from engine_advisor.model.fit.artifact import load as load_artifact
    from engine_advisor.model.fit.artifact import save
    a, _ = load_artifact(Path(d) / "old.json")
    b, _ = load_artifact(Path(d) / "new.json")
    while True:
        for m in (a, b):
            t = time.perf_counter()
            save(m, target)
            took.value = time.perf_counter() - t
            saves.value += 1


def _wait_for(saves, n: int, p) -> None:
    deadline = time.monotonic() + 60
    while saves.value < n:
        assert p.is_alive() and time.monotonic() < deadline, "the writer made no progress"
        time.sleep(0.0005)


def test_writer_killed_at_random_times_leaves_a_loadable_model(models, tmp_path):
    """The writer reports each save it completes, so that the kills are placed by its
    progress, not by a clock that a loaded machine (or a slow fork of a large test process)
    makes wrong: half land just after a save completed (the old model's or the new one's, at
    random), half at a random point inside the next save."""
    d, old, _ = models
    a, b = _resaved(d / "old.json", tmp_path), _resaved(d / "new.json", tmp_path)
    target = tmp_path / "model.json"
    _install(d / "old.json", target)
    rng = random.Random(20240917)
    versions = set()
    for kill in range(16):
        saves, took = FORK.Value("i", 0), FORK.Value("d", 0.0)
        p = FORK.Process(target=_save_forever, args=(str(d), str(target), saves, took))
        p.start()
        n = rng.randint(1, 4)
        _wait_for(saves, n, p)
        if kill % 2:                       # somewhere inside save n + 1
            time.sleep(rng.uniform(0.0, 1.0) * took.value)
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        assert p.exitcode == -signal.SIGKILL
        model, _ = load(target)
        assert model.version in (a, b)
        versions.add(model.version)
    assert versions == {a, b}


def _tamper(kind: str, path: Path) -> str:
    """Damage the artifact at ``path`` (its document ``NAME.json`` or its arrays
    ``NAME.npz``); returns a word the refusal must contain."""
    ap = arrays_path(path)
    raw = ap.read_bytes()
    if kind == "truncated":
        ap.write_bytes(raw[: len(raw) // 2])
        return "truncated"
    if kind == "bit-flipped":
        ap.write_bytes(raw[:100] + bytes([raw[100] ^ 1]) + raw[101:])
        return "sha256"
    if kind == "empty":
        ap.write_bytes(b"")
        return "sha256"
    if kind == "arrays-missing":
        ap.unlink()
        return "arrays"
    doc = json.loads(path.read_text())
    if kind == "metadata-sha":
        doc["arrays_sha256"] = "0" * 64
        path.write_text(json.dumps(doc))
        return "sha256"
    if kind == "model-edited":          # a coefficient changed by hand: still valid JSON
        est = next(iter(doc["model"]["engines"].values()))
        est["params"]["noise_floor"] *= 2
        path.write_text(json.dumps(doc))
        return "artifact_sha256"
    if kind == "document-truncated":
        text = path.read_text()
        path.write_text(text[: len(text) // 2])
        return "not valid json"
    if kind == "metadata-garbage":
        path.write_bytes(b"\x00{not json")
        return "not valid json"
    if kind == "schema-version":
        doc["schema_version"] = 99
        path.write_text(json.dumps(doc))
        return "schema version"
    raise AssertionError(kind)


DAMAGE = ["truncated", "bit-flipped", "empty", "arrays-missing", "metadata-sha", "model-edited",
          "document-truncated", "metadata-garbage", "schema-version"]


@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_artifact_is_refused_at_load_and_reload(models, tmp_path, kind):
    d, _, _ = models
    target = tmp_path / "m.json"
    _install(d / "new.json", target)
    word = _tamper(kind, target)
    with pytest.raises(ArtifactError) as info:
        load(target)
    assert word in str(info.value).lower()
    with make_client(admin_token=TOKEN, models_dir=tmp_path) as c:
        before = c.get("/v1/model").json()["model_version"]
        err = assert_error(c.post("/v1/model/reload", json={"path": "m.json"}, headers=AUTH),
                           422, param="path")
        assert word in err["message"].lower() and "still serving" in err["message"]
        assert c.get("/v1/model").json()["model_version"] == before
        assert c.post("/v1/recommend", json={"context_tokens": 65536, "output_tokens": 2048,
                                             "batch_size": 64,
                                             "kv_bytes_per_token": 70272}).status_code == 200


@pytest.mark.parametrize("command_line", [
    ["serve", "--port", "0", "--model"],
    ["recommend", "--context-tokens", "65536", "--output-tokens", "8",
     "--kv-bytes-per-token", "70272", "--model"],
])
def test_damaged_artifact_is_refused_by_the_cli(models, tmp_path, command_line):
    d, _, _ = models
    target = tmp_path / "m.json"
    _install(d / "new.json", target)
    _tamper("truncated", target)
    r = subprocess.run([str(BIN), *command_line, str(target)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("engine-advisor: error: artifact") and "truncated" in r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------ calibration crash-resume
def _complete_lines_parse(path: Path) -> int:
    """Every newline-terminated line of a dataset CSV parses (a kill may leave one torn
    line after them, which the next run cuts off); returns the number of rows."""
    raw = path.read_bytes() if path.exists() else b""
    whole = raw[: raw.rfind(b"\n") + 1].decode()
    return len(parse_csv(whole, str(path))) if whole else 0


def _running(url: str) -> float:
    """The simulator's vllm:num_requests_running gauge (0 when it cannot be read)."""
    try:
        text = httpx.get(url + "/metrics", timeout=2.0).text
    except httpx.HTTPError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _kill_when(mode: str, proc: subprocess.Popen, url: str, dataset: Path, rng: random.Random,
               timeout: float = 90.0) -> None:
    """Wait for the moment ``mode`` names, then SIGKILL ``proc``. The moments are events, not
    times, so a loaded machine delays the kills instead of moving them all into start-up:
    'start-up' a random moment within the first 0.3 s (the CLI is still importing),
    'request' as soon as the simulator runs one of the sweep's requests, 'point' a random
    0-0.3 s after the run's first new dataset row (between points or in the next one)."""
    rows = _complete_lines_parse(dataset)
    deadline = time.monotonic() + timeout
    if mode == "start-up":
        time.sleep(rng.uniform(0.0, 0.3))
    else:
        while not (_running(url) > 0 if mode == "request"
                   else _complete_lines_parse(dataset) > rows):
            assert proc.poll() is None, f"the sweep ended before the '{mode}' kill"
            assert time.monotonic() < deadline, f"no '{mode}' moment in {timeout} s"
            time.sleep(0.02)
        if mode == "point":
            time.sleep(rng.uniform(0.0, 0.3))
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


KILLS = ["start-up", "request", "point", "request", "start-up", "point", "request", "point",
         "start-up", "point"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_calibration_killed_ten_times_then_resumed_has_every_point_once(tmp_path):
    sims = SimProcs(tmp_path)
    try:
        url = sims.start("vllm", "--time-scale", "1", "--max-model-len", "65536")
        out = tmp_path / "run"
        rng = random.Random(7)
        rows_seen = []
        for mode in KILLS:
            before = _complete_lines_parse(out / "dataset.csv")
            proc = subprocess.Popen([str(BIN), *command(url, out)], cwd=REPO,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                _kill_when(mode, proc, url, out / "dataset.csv", rng)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            rows_seen.append(_complete_lines_parse(out / "dataset.csv"))
            assert rows_seen[-1] >= before                        # nothing recorded is lost
            if mode == "point":
                assert rows_seen[-1] > before
            if (out / "manifest.json").exists():
                json.loads((out / "manifest.json").read_text())     # replaced atomically
            for line in (out / "samples.jsonl").read_text().splitlines()[:-1] \
                    if (out / "samples.jsonl").exists() else []:
                json.loads(line)
        assert rows_seen[-1] < 16, "every point finished before the last kill"
        finish = subprocess.run([str(BIN), *command(url, out)], cwd=REPO, capture_output=True,
                                text=True, timeout=120)
        assert finish.returncode == 0, finish.stderr
        check_exactly_once(out)
        read_csv(out / "dataset.csv")
        manifest = json.loads((out / "manifest.json").read_text())
        assert 2 <= len(manifest["runs"]) <= 11 and manifest["runs"][-1]["status"] == "finished"
        print(f"\ncalibration crash-resume: kills {KILLS}, finished points after each "
              f"{rows_seen}")
    finally:
        sims.stop_all()
