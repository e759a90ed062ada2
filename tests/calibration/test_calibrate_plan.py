"""``calibrate plan``: suggestions near the crossover and outside the calibrated range."""

from __future__ import annotations

import json
import math

import pytest
from calib_helpers import cli_in_process
from calib_synth import KV, rows

from engine_advisor.calibration.sweep.plan import plan
from engine_advisor.model.decision.crossover import crossover_near
from engine_advisor.model.fit.artifact import save
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.hardware.profiles import PROFILES_ENV
from engine_advisor.model.queries import query_for
from engine_advisor.model.workload import Config, Workload


@pytest.fixture(scope="module", autouse=True)
def spec_physics(tmp_path_factory):
    """The synthetic B300 truth and the thresholds below are set on spec-sheet KV physics: no
    hardware profile here, whichever profiles calibration/profiles ships."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(PROFILES_ENV, str(tmp_path_factory.mktemp("no-profiles")))
        yield


@pytest.fixture(scope="module")
def model():
    return CostModel.fit(rows(contexts=(2048, 4096, 8192, 16384), batches=(1, 4), outputs=(32,)))


def workload(ctx: int = 8192) -> Workload:
    return Workload(context_tokens=ctx, output_tokens=32, batch_size=4, kv_bytes_per_token=KV)


def test_top_suggestions_sit_at_the_crossover(model):
    w = workload()
    cross = crossover_near(query_for(model, w), w, [Config("vllm", 1), Config("sglang", 8)])
    points = plan(model, w, n_points=4)
    top = points[:2]
    assert {(p.engine, p.dcp_size) for p in top} == {("vllm", 1), ("sglang", 8)}
    for p in top:
        assert abs(math.log(p.context_tokens / cross)) < math.log(1.5)
        assert p.flip_probability > 0.2
        assert any("near the predicted crossover" in r for r in p.reasons)
    # far from the crossover the ranking is certain: nothing suggested there
    assert all(abs(math.log(p.context_tokens / cross)) < math.log(4) for p in points)


def test_outside_the_calibrated_range_is_flagged():
    """Data from 12K up; the crossover (about 7K) lies below it: points there are suggested
    and flagged as outside the calibrated range."""
    model = CostModel.fit(rows(contexts=(12288, 16384, 24576), batches=(1, 4), outputs=(32,)))
    w = workload(6144)
    points = plan(model, w, contexts=[4096, 6144, 8192], n_points=6)
    assert points, "a workload beyond the data must get suggestions"
    assert all("outside the calibrated range" in " ".join(p.reasons) for p in points)


def test_uncalibrated_configurations_only_on_request(model):
    w = workload()
    assert {p.dcp_size for p in plan(model, w)} <= {1, 8}
    wide = plan(model, w, n_points=20, include_uncalibrated=True)
    assert any("no calibration data" in " ".join(p.reasons) for p in wide)


def test_cli_plan_json_and_table(model, tmp_path):
    save(model, tmp_path / "m.json")
    args = ["calibrate", "plan", "--model", str(tmp_path / "m.json"), "--context-tokens", "8192",
            "--output-tokens", "32", "--batch-size", "4", "--kv-bytes-per-token", str(KV)]
    r = cli_in_process(*args, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["points"] and all(c.startswith("engine-advisor calibrate run --engine ")
                                 for c in out["commands"])
    r = cli_in_process(*args, "--points", "2")
    assert r.returncode == 0 and "near the predicted crossover" in r.stdout
    bad = cli_in_process("calibrate", "plan", "--output-tokens", "32")
    assert bad.returncode == 2 and "--kv-bytes-per-token" in bad.stderr
