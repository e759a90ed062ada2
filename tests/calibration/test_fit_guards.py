"""``fit`` refuses what would mean nothing: rows without an architecture (unless asked to fit
KV bytes alone), and fits where most rows beat their roofline (a simulator run faster than
real time is named as the cause) or the held-out error is absurd."""

from __future__ import annotations

import pytest
from calib_helpers import cli_in_process
from calib_synth import KV, rows

from engine_advisor.model.fit.dataset import read_csv, write_csv
from engine_advisor.model.fit.default import REAL_CSV


def test_rows_without_an_architecture_are_refused_and_named(tmp_path):
    write_csv(tmp_path / "d.csv", rows(contexts=(2048, 4096), batches=(1, 4), outputs=(32,)))
    r = cli_in_process("fit", str(tmp_path / "d.csv"), "--out", str(tmp_path / "m.json"))
    assert r.returncode == 2
    assert "rows name no served model's architecture (vllm 2048 x 1" in r.stderr
    assert "--preset" in r.stderr and "--kv-bytes-only" in r.stderr
    assert not (tmp_path / "m.json").exists()
    ok = cli_in_process("fit", "--kv-bytes-only", str(tmp_path / "d.csv"), "--out",
                        str(tmp_path / "m.json"))
    assert ok.returncode == 0, ok.stderr


def test_rows_faster_than_physics_are_refused_unless_forced(tmp_path):
    fast = [r.model_copy(update={"total_s": r.total_s / 50, "ttft_s": r.ttft_s / 50,
                                 "decode_step_s": r.decode_step_s and r.decode_step_s / 50})
            for r in read_csv(REAL_CSV) if r.total_s]       # (batches run in waves: no step)
    write_csv(tmp_path / "d.csv", fast)
    r = cli_in_process("fit", str(tmp_path / "d.csv"), "--out", str(tmp_path / "m.json"))
    assert r.returncode == 2
    assert "timed rows are faster than their roofline" in r.stderr and "--force" in r.stderr
    assert not (tmp_path / "m.json").exists()
    forced = cli_in_process("fit", "--force", str(tmp_path / "d.csv"), "--out",
                            str(tmp_path / "m.json"))
    assert forced.returncode == 0, forced.stderr
    assert "faster than its roofline" in forced.stdout


@pytest.mark.slow
def test_a_simulator_below_real_time_is_named_as_the_cause(tmp_path, sims):
    url = sims.start("vllm", "--time-scale", "0.01", "--kv-bytes-per-token", str(KV),
                     "--max-model-len", "65536")
    run = cli_in_process("calibrate", "run", "--engine", "vllm", "--url", url, "--contexts",
                         "2048,8192,16384", "--batch-sizes", "1,4", "--output-tokens", "32",
                         "--kv-bytes-per-token", str(KV), "--out", str(tmp_path / "run"),
                         "--no-progress", "--no-warmup")
    assert run.returncode == 0, run.stderr
    r = cli_in_process("fit", "--kv-bytes-only", str(tmp_path / "run"), "--out",
                       str(tmp_path / "m.json"))
    assert r.returncode == 2
    assert "time scale 0.01" in r.stderr and "100x faster than the physics" in r.stderr
