"""Measured hardware profiles in the cost model: read curves, the committed H200 profiles, the
spec fallback, and what the recommendation says about them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from model.costmodel import CostModel, training_matrix
from model.dataset import Measurement
from model.default import default_model
from model.hardware import (
    DcpCommModel,
    GpuSpec,
    KvReadModel,
    builtin_gpu,
    dcp_comm_model,
    dcp_comm_seconds,
    kv_read_model,
)
from model.hwprofile import DEFAULT_PROFILES_DIR, PROFILES_ENV, eval_read_curve, fit_read_curve
from model.recommend import evaluate, recommend
from model.workload import Config, Workload

H200 = builtin_gpu("H200")
BIN = Path(sys.executable).with_name("engine-advisor")


def _workload(gpu="H200", **kw) -> Workload:
    base = dict(context_tokens=204800, output_tokens=2048, batch_size=64,
                kv_bytes_per_token=70272, gpu=gpu, allow_extrapolation=True)
    return Workload(**{**base, **kw})


@pytest.fixture
def no_profiles(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILES_ENV, str(tmp_path / "empty"))


def test_read_curve_is_monotone_and_follows_the_measurements():
    rng = np.random.default_rng(3)
    b = np.geomspace(1e5, 5e10, 80)
    t = (3e-6 + b / (4.5e12 * b / (b + 3e7))) * rng.lognormal(0, 0.02, len(b))
    curve = fit_read_curve(b, t, overhead_s=2e-6)
    grid = np.geomspace(1.0, 1e13, 400)
    pred = eval_read_curve(curve, grid)
    assert np.all(np.diff(pred) > 0)                  # strictly increasing, also outside the data
    assert pred[0] == pytest.approx(2e-6, rel=1e-3)   # the per-call floor
    inside = eval_read_curve(curve, b)
    assert np.median(np.abs(inside - t) / t) < 0.03
    assert curve["asymptotic_Bps"] == pytest.approx(4.5e12, rel=0.05)
    # far beyond the data: bytes at the asymptotic bandwidth
    assert eval_read_curve(curve, [1e13])[0] == pytest.approx(1e13 / 4.5e12, rel=0.05)


def test_read_curve_needs_two_points():
    with pytest.raises(ValueError, match="two positive"):
        fit_read_curve([1e6], [1e-5])


def test_committed_h200_profile_is_used_for_h200_only():
    read = kv_read_model(H200)
    assert read.source == "profile:h200.json"
    prof = json.loads((DEFAULT_PROFILES_DIR / "h200.json").read_text())
    big = np.array([1e11, 1e12])
    assert np.allclose(read.seconds(big), eval_read_curve(prof["kv_read"], big))
    # measured effective bandwidth, below the 4.8 TB/s spec sheet
    assert 0.5 * H200.hbm_bandwidth < read.asymptotic_bandwidth < H200.hbm_bandwidth
    # B300 and H100 profiles imported from aiconfigurator-core's tables (docs/silicon-profiles.md)
    assert kv_read_model(builtin_gpu("B300")).source == "profile:b300.json"
    assert kv_read_model(builtin_gpu("H100")).source == "profile:h100.json"
    other = GpuSpec(name="X100", memory_bytes=96e9, hbm_bandwidth=4e12)
    assert type(kv_read_model(other)) is KvReadModel and kv_read_model(other).source == "spec"


def test_profiles_dir_setting_and_spec_fallback(tmp_path, monkeypatch):
    monkeypatch.setenv(PROFILES_ENV, str(tmp_path / "missing"))
    assert kv_read_model(H200).source == "spec"
    assert dcp_comm_model(H200) is None and dcp_comm_seconds(H200, 8, 2) is None
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy(DEFAULT_PROFILES_DIR / "h200.json", mine / "lab-h200.json")
    (mine / "notes.json").write_text('{"kind": "something else"}')
    (mine / "broken.json").write_text("{not json")
    monkeypatch.setenv(PROFILES_ENV, str(mine))
    assert kv_read_model(H200).source == "profile:lab-h200.json"
    assert dcp_comm_model(H200) is None            # no DCP profile in this directory


def test_profile_changes_kv_read_time_by_the_measured_bandwidth(monkeypatch, tmp_path):
    model = default_model()
    w = _workload()
    layout = w.kv_layout()
    with_profile = evaluate(model, w, layout, [Config("vllm", 1)])[0]
    read = kv_read_model(H200)
    monkeypatch.setenv(PROFILES_ENV, str(tmp_path / "none"))
    spec = evaluate(model, w, layout, [Config("vllm", 1)])[0]
    assert with_profile.pred.kv_read_source == "profile:h200.json"
    assert spec.pred.kv_read_source == "spec"
    ratio = with_profile.step_parts["kv_read"] / spec.step_parts["kv_read"]
    nbytes = w.batch_size * (w.context_tokens + w.output_tokens / 2) * w.kv_bytes_per_token
    measured = read.seconds(np.array([nbytes]))[0]
    assert ratio == pytest.approx(measured / (nbytes / H200.hbm_bandwidth), rel=1e-6)
    assert 1.0 < ratio < 1.3          # the measured H200 reads slower than its spec sheet


def test_recommend_says_which_profiles_were_used():
    rec = recommend(default_model(), _workload(), "v")
    assert {p.kv_read_source for p in rec.predictions} == {"profile:h200.json"}
    text = "\n".join(rec.reasons)
    assert "measured H200 profile (h200.json)" in text
    assert "H200 DCP profile (h200-dcp.json; dcp 2 measured, 4, 8 extrapolated)" in text
    b300 = recommend(default_model(), _workload(gpu="B300"), "v")
    assert {p.kv_read_source for p in b300.predictions} == {"profile:b300.json"}
    assert any("B300 profile (b300.json)" in r for r in b300.reasons)
    assert not any("DCP profile" in r for r in b300.reasons)


def test_cli_recommend_h200_states_the_profile():
    out = subprocess.run(
        [str(BIN), "recommend", "--gpu", "H200", "--allow-extrapolation",
         "--context-tokens", "204800", "--output-tokens", "2048", "--batch-size", "64",
         "--kv-bytes-per-token", "70272"], capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "KV-read physics from the measured H200 profile (h200.json)" in out.stdout
    assert "H200 DCP profile (h200-dcp.json" in out.stdout


def test_dcp_comm_model_from_the_committed_profile():
    comm = dcp_comm_model(H200)
    assert isinstance(comm, DcpCommModel) and comm.source == "profile:h200-dcp.json"
    assert comm.measured == [2]
    batch = np.array([1.0, 8.0, 64.0])
    assert np.all(dcp_comm_seconds(H200, batch, np.ones(3)) == 0)     # no DCP, no combine
    s2 = dcp_comm_seconds(H200, batch, np.full(3, 2.0))
    s8 = dcp_comm_seconds(H200, batch, np.full(3, 8.0))
    assert np.all(s2 > 0) and np.all(np.diff(s2) > 0) and np.all(s8 > s2)
    # per layer: the measured step overhead of the reference shape at dcp 2, batch 64
    assert comm.layer_seconds(np.array([64.0]), np.array([2.0]))[0] < 1e-3
    # the unit: one more sequence at dcp 2 adds half a sequence-equivalent, as batch*(dcp-1)/dcp
    f = comm.sequence_equivalents(np.array([10.0, 11.0]), np.array([2.0, 2.0]))
    assert f[1] - f[0] == pytest.approx(0.5)
    assert dcp_comm_model(builtin_gpu("B300")) is None


def test_training_rows_use_the_measured_combine_feature():
    def row(gpu, dcp, total):
        return Measurement(engine="sglang", gpu=gpu, num_gpus=8, dcp_size=dcp, mem_fraction=0.9,
                           context_tokens=65536, output_tokens=256, batch_size=16,
                           kv_bytes_per_token=70272, total_s=total)

    X, _ = training_matrix([row("B300", 8, 5.0)])
    assert X.shape[1] == 7                                   # no profile: unchanged schema
    X, _ = training_matrix([row("B300", 8, 5.0), row("H200", 2, 9.0)])
    assert X.shape[1] == 8
    assert X[0, 7] == pytest.approx(16 * 7 / 8)              # spec shape for the B300 row
    comm = dcp_comm_model(H200)
    assert X[1, 7] == pytest.approx(comm.sequence_equivalents(np.array([16.0]),
                                                              np.array([2.0]))[0])
    model = CostModel.fit([row("B300", 8, 5.0), row("H200", 2, 9.0), row("H200", 1, 12.0)])
    assert model.hardware == {"B300": "profile:b300.json", "H200": "profile:h200.json"}


def test_spec_fallback_leaves_predictions_unchanged(no_profiles):
    w = _workload()
    rec = recommend(default_model(), w, "v")
    assert {p.kv_read_source for p in rec.predictions} == {"spec"}
    assert not any("profile" in r for r in rec.reasons)
