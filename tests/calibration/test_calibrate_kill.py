"""A sweep killed mid-run (SIGKILL, or Ctrl-C) resumes with every point exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter

import pytest
from calib_helpers import BIN, REPO, cli_in_process

from engine_advisor.calibration.sweep.runstore import PointKey
from engine_advisor.model.fit.dataset import read_csv

CONTEXTS = [1024, 2048, 3072, 4096]
BATCHES = [1, 2]
REPEATS = 2


def command(url: str, out) -> list[str]:
    return ["calibrate", "run", "--engine", "vllm", "--url", url, "--contexts",
            ",".join(map(str, CONTEXTS)), "--batch-sizes", ",".join(map(str, BATCHES)),
            "--repeats", str(REPEATS), "--output-tokens", "16", "--kv-bytes-per-token", "70272",
            "--out", str(out), "--no-progress"]


def wait_rows(path, n: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().count("\n") >= n + 1:
            return
        assert proc.poll() is None, "the sweep ended before it could be interrupted"
        time.sleep(0.02)
    raise AssertionError("the sweep made no progress")


def check_exactly_once(out) -> None:
    rows = read_csv(out / "dataset.csv")
    keys = Counter(PointKey.parse(r.source.removeprefix("calibrate:")) for r in rows)
    expected = {PointKey("vllm", 1, 0.9, c, b, 16, rep) for rep in range(REPEATS)
                for c in CONTEXTS for b in BATCHES}
    assert set(keys) == expected and set(keys.values()) == {1}
    assert all(r.total_s is not None for r in rows)
    samples = [json.loads(s) for s in (out / "samples.jsonl").read_text().splitlines()]
    per_key = Counter(s["key"] for s in samples)
    assert per_key == {k.text(): k.batch_size for k in expected}


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_gives_every_point_once(tmp_path, sims):
    url = sims.start("vllm", "--time-scale", "0.25", "--max-model-len", "65536")
    out = tmp_path / "run"
    proc = subprocess.Popen([str(BIN), *command(url, out)], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_rows(out / "dataset.csv", 3, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    done_before = len(read_csv(out / "dataset.csv"))
    assert 3 <= done_before < len(CONTEXTS) * len(BATCHES) * REPEATS
    # a kill in the middle of a write leaves half a line (and samples of the lost point)
    with open(out / "dataset.csv", "a") as f:
        f.write("vllm,0.11.0+sim,B300,8,1,0.9,4096,16,2,70272,1,0.0")
    with open(out / "samples.jsonl", "a") as f:
        f.write(json.dumps({"key": "vllm:dcp=1:mem=0.9:ctx=4096:batch=2:out=16:rep=1"}) + "\n")
    r = cli_in_process(*command(url, out))
    assert r.returncode == 0, r.stderr
    assert "repaired" in r.stderr and "torn last line" in r.stderr
    check_exactly_once(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runs"][0]["status"] == "running"       # the killed run never finished
    assert manifest["runs"][-1]["status"] == "finished"
    assert manifest["runs"][-1]["points_already_done"] == done_before


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_resumes(tmp_path, sims):
    url = sims.start("vllm", "--time-scale", "0.25", "--max-model-len", "65536")
    out = tmp_path / "run"
    proc = subprocess.Popen([str(BIN), *command(url, out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_rows(out / "dataset.csv", 2, proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert "re-run the same command to resume" in err and "Traceback" not in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runs"][-1]["status"] == "interrupted"
    read_csv(out / "dataset.csv")        # whole lines only
    r = cli_in_process(*command(url, out))
    assert r.returncode == 0, r.stderr
    check_exactly_once(out)
