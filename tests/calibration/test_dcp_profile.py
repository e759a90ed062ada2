"""``calibrate dcp``: the multi-process code path on the CPU (gloo, 2 processes), and the
committed 2 x H200 DCP profile (crossovers, hold-out check, merged-output check)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine_advisor.calibration.kernels.dcp_profile import (
    build_profile,
    crossovers,
    holdout_check,
    read_dataset,
)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).with_name("engine-advisor")
PROFILES = ROOT / "calibration" / "profiles"


@pytest.fixture(scope="module")
def profile() -> dict:
    return json.loads((PROFILES / "h200-dcp.json").read_text())


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return read_dataset(PROFILES / "h200-dcp.csv")


def test_committed_dcp_profile_crossovers(profile, rows):
    assert profile["gpu_key"] == "H200" and profile["world"] == 2
    assert profile["dcp_sizes_measured"] == [2]
    assert profile["dcp_sizes_not_measured"] == [4, 8]
    for backend in ("ag", "a2a"):
        per_batch = profile["crossover"][backend]["2"]
        found = {int(b): c["crossover_context_tokens"] for b, c in per_batch.items()
                 if c["crossover_context_tokens"]}
        assert len(found) >= 2, per_batch
        # measured: small batches need longer contexts before splitting the KV pays off
        assert found[1] > found[8] > found[64]
        for b, x in found.items():
            steps = sorted((r for r in rows if r["kind"] == "dcp_step" and r["backend"] == backend
                            and r["batch_size"] == b), key=lambda r: r["context_tokens"])
            below = [r for r in steps if r["context_tokens"] < x]
            above = [r for r in steps if r["context_tokens"] > x]
            assert below and below[-1]["total_s"] > below[-1]["dcp1_s"]      # DCP slower
            assert above and above[0]["total_s"] < above[0]["dcp1_s"]        # DCP faster
    again = crossovers(rows)            # the committed CSV gives the committed crossovers
    for backend, per_d in profile["crossover"].items():
        for b, c in per_d["2"].items():
            assert again[backend]["2"][b]["crossover_context_tokens"] == pytest.approx(
                c["crossover_context_tokens"], rel=1e-3)


def test_committed_dcp_profile_holdout_within_15_percent(profile, rows):
    h = holdout_check(rows, seed=0)
    print(f"\nDCP hold-out: {h['n_test']} points, median {h['median_rel_err']:.2%}, "
          f"max {h['max_rel_err']:.2%}")
    assert h["n_test"] == round(profile["n_points"] / 3)
    assert h["median_rel_err"] < 0.15
    assert holdout_check(rows, seed=1)["median_rel_err"] < 0.15
    assert profile["holdout"]["median_rel_err"] == pytest.approx(h["median_rel_err"], rel=1e-3)


def test_committed_dcp_profile_merged_output_matched_full_attention(profile):
    for backend in ("ag", "a2a"):
        assert profile["check"]["2"][backend]["rel_err"] < 1e-2     # bf16 partials


def test_single_gpu_split_attention_is_committed(rows):
    """The split-KV attention time for 1/dcp of the context, and the full-context baseline."""
    full = {(r["batch_size"], r["context_tokens"]): r["attn_s"] for r in rows
            if r["kind"] == "dcp1"}
    split = [r for r in rows if r["kind"] == "dcp_step" and r["backend"] == "ag"]
    assert len(full) == len(split) >= 49
    big = [r for r in split if r["batch_size"] * r["context_tokens"] >= 64 * 65536]
    ratios = [full[(r["batch_size"], r["context_tokens"])] / r["attn_s"] for r in big]
    assert np.median(ratios) == pytest.approx(2.0, rel=0.1)   # half the KV, half the time


@pytest.mark.slow
def test_dcp_gloo_two_processes(tmp_path):
    """The multi-process path end to end on CPU: 2 gloo processes, both combine backends,
    merged output vs full attention, the profile built from what they measured."""
    pytest.importorskip("torch")
    out = tmp_path / "cpu-dcp.json"
    raw = tmp_path / "raw.json"
    r = subprocess.run(
        [str(BIN), "calibrate", "dcp", "--cpu", "2", "--dcp-sizes", "2",
         "--batches", "1,2", "--contexts", "64,256", "--out", str(out), "--save-raw", str(raw)],
        capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(raw.read_text())
    assert data["world"] == 2 and data["device"] == "cpu"
    for backend in ("ag", "a2a"):
        # fp32 on the CPU: sums over 4,096 tokens in an order that depends on the BLAS threads
        # (1.01e-5 seen beside two other test runs); a wrong merge is off by far more than 1e-4
        assert data["checks"]["2"][backend]["rel_err"] < 1e-4
    steps = [x for x in data["rows"] if x["kind"] == "dcp_step"]
    assert {(x["backend"], x["batch_size"], x["context_tokens"]) for x in steps} == {
        (b, n, c) for b in ("ag", "a2a") for n in (1, 2) for c in (64, 256)}
    assert all(x["attn_s"] > 0 and x["comm_s"] > 0 and x["total_s"] > 0 for x in steps)
    coll = {(x["backend"], x["message_bytes"]) for x in data["rows"] if x["kind"] == "collective"}
    assert {op for op, _ in coll} == {"all_gather", "all_to_all"}
    prof = json.loads(out.read_text())
    assert prof["kind"] == "dcp-profile" and prof["dcp_sizes_measured"] == [2]
    assert set(prof["fit"]) == {"ag", "a2a"}
    assert out.with_suffix(".csv").exists()


def test_dcp_cli_refuses_one_process(tmp_path):
    pytest.importorskip("torch")
    r = subprocess.run([str(BIN), "calibrate", "dcp", "--cpu", "1",
                        "--out", str(tmp_path / "x.json")], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "at least 2 processes" in r.stderr
    assert "Traceback" not in r.stderr


def test_build_profile_needs_step_rows():
    with pytest.raises(ValueError, match="no DCP layer-step"):
        build_profile({"rows": [], "gpu": "x", "world": 2}, dataset_name="x.csv", command="c")
