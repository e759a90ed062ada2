"""Launch mode: the harness starts an engine per (DCP, memory fraction), sweeps, stops it; failed
starts and OOMs become data points that steer the memory-fraction recommendation."""

from __future__ import annotations

import json
import shlex

import httpx
import pytest
from calib_helpers import BIN, cli_in_process

from engine_advisor.model.fit.artifact import load
from engine_advisor.model.fit.dataset import read_csv
from engine_advisor.model.physics.memory import choose_fraction

SIM = (f"{shlex.quote(str(BIN))} sim --engine vllm --port {{port}} --dcp-size {{dcp_size}} "
       "--mem-fraction {mem_fraction} --num-gpus {num_gpus} --model-name {model} "
       "--time-scale 0.1 --max-model-len 65536 --oom-threshold 0.95")


def run(tmp_path, launch: str, *extra: str, fractions: str = "0.92,0.95"):
    return cli_in_process(
        "calibrate", "run", "--engine", "vllm", "--launch", launch, "--model", "kimi-k3",
        "--dcp-sizes", "1", "--mem-fractions", fractions, "--contexts", "2048,4096",
        "--batch-sizes", "1,2", "--output-tokens", "16", "--kv-bytes-per-token", "70272",
        "--retries", "1", "--stop-grace", "5", "--out", str(tmp_path / "run"), "--no-progress",
        *extra)


def engines_are_gone(manifest: dict) -> None:
    for info in manifest["engines"].values():
        with pytest.raises(httpx.ConnectError):
            httpx.get(info["url"] + "/health", timeout=2)


@pytest.mark.slow
def test_oom_at_the_threshold_is_recorded_and_the_safe_fraction_recommended(tmp_path):
    r = run(tmp_path, SIM + " --oom-rate 1.0")
    assert r.returncode == 0, r.stderr
    rows = read_csv(tmp_path / "run" / "dataset.csv")
    assert len(rows) == 8
    safe = [x for x in rows if x.mem_fraction == 0.92]
    oom = [x for x in rows if x.mem_fraction == 0.95]
    assert all(x.total_s is not None and x.oom_retries == 0 for x in safe)
    assert all(x.total_s is None and x.oom_retries == 2 and x.unsafe for x in oom)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert set(manifest["engines"]) == {"dcp=1,mem=0.92", "dcp=1,mem=0.95"}
    info = manifest["engines"]["dcp=1,mem=0.95"]
    assert info["version"] == "0.11.0+sim" and "--mem-fraction" in info["command"]
    assert any("gpu_memory_utilization': 0.95" in s for s in info["server_args_log"])
    assert (tmp_path / "run" / "logs" / "engine-dcp1-mem0.95.log").exists()
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert "CUDA out of memory" in events
    engines_are_gone(manifest)

    fit = cli_in_process("fit", str(tmp_path / "run"), "--out", str(tmp_path / "m.json"),
                         "--kv-bytes-only")
    assert fit.returncode == 0, fit.stderr
    model, _ = load(tmp_path / "m.json")
    assert model.memory["vllm/B300"] == {"safe": [0.92], "unsafe": [0.95]}
    assert choose_fraction("vllm", "B300", **model.safe_fractions("vllm", "B300")).fraction == 0.92
    rec = cli_in_process("recommend", "--model", str(tmp_path / "m.json"), "--context-tokens",
                         "4096", "--output-tokens", "16", "--batch-size", "2",
                         "--kv-bytes-per-token", "70272", "--engines", "vllm", "--dcp-sizes", "1",
                         "--json")
    assert rec.returncode == 0, rec.stderr
    assert json.loads(rec.stdout)["mem_fraction"] == 0.92


@pytest.mark.slow
def test_oom_at_startup_becomes_data_points(tmp_path):
    r = run(tmp_path, SIM + " --oom-on-startup")
    assert r.returncode == 0, r.stderr
    rows = read_csv(tmp_path / "run" / "dataset.csv")
    oom = [x for x in rows if x.mem_fraction == 0.95]
    assert len(oom) == 4
    assert all(x.total_s is None and x.oom_retries == 2 and x.errors == 1 for x in oom)
    assert "oom" in r.stdout and "engine exited with status 1" in r.stdout
    log = (tmp_path / "run" / "logs" / "engine-dcp1-mem0.95.log").read_text()
    assert log.count("# engine-advisor: starting") == 2 and "CUDA out of memory" in log


def test_a_command_that_fails_to_start_is_recorded(tmp_path):
    r = run(tmp_path, "false {port}", fractions="0.9")
    assert r.returncode == 0, r.stderr
    rows = read_csv(tmp_path / "run" / "dataset.csv")
    assert len(rows) == 4 and all(x.errors == 1 and x.oom_retries == 0 and x.unsafe for x in rows)
    assert "failed-start" in r.stdout


def test_a_start_that_never_becomes_healthy_times_out_and_is_stopped(tmp_path):
    r = run(tmp_path, "sleep 60", "--startup-timeout", "0.5", "--retries", "0", fractions="0.9")
    assert r.returncode == 0, r.stderr
    events = [json.loads(s) for s in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    starts = [e for e in events if e["kind"] == "start-failed"]
    assert len(starts) == 1 and "not healthy after 0.5 s" in starts[0]["message"]
    assert len(read_csv(tmp_path / "run" / "dataset.csv")) == 4


@pytest.mark.parametrize("launch, message", [
    ("vllm serve {modle}", "--launch: unknown placeholder {modle}"),
    ("vllm 'serve", "--launch: cannot split the command"),
])
def test_bad_launch_templates(tmp_path, launch, message):
    r = run(tmp_path, launch)
    assert r.returncode == 2 and message in r.stderr


@pytest.mark.slow
def test_sigterm_mid_sweep_stops_the_launched_engine(tmp_path):
    import signal
    import subprocess
    import time

    from calib_helpers import REPO

    out = tmp_path / "run"
    proc = subprocess.Popen(
        [str(BIN), "calibrate", "run", "--engine", "vllm", "--launch", SIM.replace("0.1", "0.5"),
         "--model", "kimi-k3", "--mem-fractions", "0.9", "--contexts", "2048,4096,8192",
         "--batch-sizes", "1,2", "--output-tokens", "16", "--kv-bytes-per-token", "70272",
         "--stop-grace", "5", "--out", str(out), "--no-progress"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ((out / "dataset.csv").exists()
                   and (out / "dataset.csv").read_text().count("\n") >= 2):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "re-run the same command to resume" in err
    manifest = json.loads((out / "manifest.json").read_text())
    engines_are_gone(manifest)
    assert "engine stopped" in (out / "events.jsonl").read_text()
