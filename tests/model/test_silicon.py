"""GPU physics (engine_advisor.model.hardware.silicon): measured profiles per quantity, the
spec-sheet fallback, and what predictions say about where their physics came from."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.hardware.gpus import builtin_gpu
from engine_advisor.model.hardware.profiles import (
    DEFAULT_PROFILES_DIR,
    PROFILES_ENV,
    clear_profile_cache,
    eval_read_curve,
    find_profiles,
    fit_read_curve,
)
from engine_advisor.model.hardware.silicon import (
    SPEC_EFFICIENCY,
    Silicon,
    roofline_silicon,
    silicon_for,
)
from engine_advisor.model.queries import evaluate
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Config, Workload

H200 = builtin_gpu("H200")
BIN = Path(sys.executable).with_name("engine-advisor")


def _workload(gpu="H200", **kw) -> Workload:
    base = dict(context_tokens=204800, output_tokens=2048, batch_size=64,
                kv_bytes_per_token=70272, gpu=gpu, allow_extrapolation=True)
    return Workload(**{**base, **kw})


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    """An empty profiles directory the test may fill."""
    d = tmp_path / "profiles"
    d.mkdir()
    monkeypatch.setenv(PROFILES_ENV, str(d))
    clear_profile_cache()
    yield d
    clear_profile_cache()


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
    assert eval_read_curve(curve, [1e13])[0] == pytest.approx(1e13 / 4.5e12, rel=0.05)


def test_read_curve_needs_two_points():
    with pytest.raises(ValueError, match="at least two"):
        fit_read_curve([1e6], [1e-5])


def test_committed_h200_profile_gives_per_family_curves():
    si = silicon_for(H200)
    prof = json.loads((DEFAULT_PROFILES_DIR / "h200.json").read_text())
    assert si.read_source("gqa", "bf16").startswith("profile:")
    big = np.array([4e9])
    want = eval_read_curve(prof["shapes"]["gqa-8x128/bf16"]["curve"], big)
    got = si.attn_read_s("gqa", "bf16", big)
    assert got[0] > 0 and want[0] > 0
    # a GPU without any profile reads at the derated spec bandwidth
    b300 = Silicon(builtin_gpu("B300"))
    assert b300.read_source("mla", "bf16") == "spec"
    assert b300.attn_read_s("mla", "bf16", big)[0] == pytest.approx(
        4e9 / (7.75e12 * SPEC_EFFICIENCY["hbm"]))


def test_profiles_dir_setting_and_spec_fallback(profiles):
    assert silicon_for(H200).sources["kv_read"] == "spec"
    shutil.copy(DEFAULT_PROFILES_DIR / "h200.json", profiles / "lab-h200.json")
    clear_profile_cache()
    assert silicon_for(H200).sources["kv_read"] == "profile:lab-h200.json"


def test_engine_kernel_tables_rank_before_the_projects_own_kernel(profiles):
    curve = lambda bw: {"bytes": [1e6, 1e9], "seconds": [1e6 / bw, 1e9 / bw],  # noqa: E731
                        "overhead_s": 1e-6, "asymptotic_Bps": bw, "n_points": 2}
    (profiles / "a-own.json").write_text(json.dumps({
        "kind": "gpu-profile", "gpu_key": "H200", "attention": {"mla": {"bf16": curve(1e12)}}}))
    (profiles / "b-engine.json").write_text(json.dumps({
        "kind": "gpu-profile", "gpu_key": "H200", "source": {"engine": "sglang"},
        "attention": {"mla": {"bf16": curve(3e12)}},
        "gemm": {"bf16": {"achievable_flops": 7e14, "weight_read_Bps": 4e12}},
        "collectives": {"all_reduce": {"8": {"latency_s": 2e-5, "bandwidth_Bps": 3e11}}}}))
    clear_profile_cache()
    si = silicon_for(H200)
    assert si.read_source("mla", "bf16") == "profile:b-engine.json"
    assert si.asymptotic_read_Bps("mla", "fp8") == pytest.approx(3e12)  # same family, bf16 curve
    assert si.gemm_flops("bf16") == pytest.approx(7e14)
    assert si.gemm_flops("fp8") == pytest.approx(1979e12 * 7e14 / 989e12)  # measured efficiency
    assert si.weight_read_Bps == pytest.approx(4e12)
    assert float(si.all_reduce_s(3e5, 8)) == pytest.approx(2e-5 + 3e5 / 3e11)


def test_roofline_uses_spec_peaks():
    peak = roofline_silicon(builtin_gpu("B300"))
    assert peak.gemm_flops("bf16") == pytest.approx(2.25e15)
    assert peak.weight_read_Bps == pytest.approx(7.75e12)


def test_recommendation_names_the_physics_sources():
    rec = recommend(default_model(), _workload(), "t")
    text = " ".join(rec.reasons)
    assert "H200 physics:" in text and "h200-aiconfigurator.json" in text
    b300 = recommend(default_model(), _workload(gpu="B300"), "t")
    assert all(p.kv_read_source for p in b300.predictions)


def test_cli_recommend_h200_states_the_profile():
    out = subprocess.run([str(BIN), "recommend", "--context-tokens", "204800", "--output-tokens",
                          "2048", "--batch-size", "64", "--kv-bytes-per-token", "70272",
                          "--gpu", "H200", "--num-gpus", "8", "--allow-extrapolation"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "H200 physics:" in out.stdout and "h200-aiconfigurator.json" in out.stdout


def test_profile_changes_predictions_only_on_its_gpu(profiles):
    w = _workload(engines=["vllm"], dcp_sizes=[1])
    spec = evaluate(default_model(), w, [Config("vllm", 1)])[0].pred
    shutil.copy(DEFAULT_PROFILES_DIR / "h200.json", profiles / "h200.json")
    clear_profile_cache()
    measured = evaluate(default_model(), w, [Config("vllm", 1)])[0].pred
    assert measured.total_s != pytest.approx(spec.total_s, rel=1e-3)
    b = _workload(gpu="B300", engines=["vllm"], dcp_sizes=[1])
    again = evaluate(default_model(), b, [Config("vllm", 1)])[0].pred
    clear_profile_cache()
    assert again.kv_read_source == "spec"


def test_imported_profiles_cover_the_nvidia_catalogue():
    """B300, B200, H100, GB200, GB300 physics from aiconfigurator-core's measured tables
    (docs/silicon-profiles.md); a custom GPU stays on its spec sheet."""
    for name in ("B300", "B200", "H100", "GB200", "GB300"):
        si = silicon_for(builtin_gpu(name))
        assert si.read_source("mla", "bf16") == f"profile:{name.lower()}.json"
        assert si.sources["gemm"] == f"profile:{name.lower()}.json"
        assert si.sources["collectives"] == f"profile:{name.lower()}.json"
        assert 0.3 < si.asymptotic_read_Bps("mla", "bf16") / si.gpu.hbm_bandwidth < 1.0
    from engine_advisor.model.hardware.gpus import GpuSpec
    other = silicon_for(GpuSpec(name="X100", memory_bytes=96e9, hbm_bandwidth=4e12))
    assert other.read_source("mla", "bf16") == "spec" and other.sources["gemm"] == "spec"


def test_every_shipped_profile_is_loaded_or_is_the_data_of_one():
    """Issue 26: every profile under calibration/profiles/ is found by the scan for its GPU
    (``find_profiles``, what ``silicon_for`` reads), and every other file there is the
    measurement a shipped profile was built from (its ``dataset``, or under raw/ what
    ``calibrate gpu|dcp --from-raw`` rebuilds it from). Where an engine's kernel table covers a
    quantity, the project's own measured kernels are not its source."""
    clear_profile_cache()
    loaded, datasets = set(), set()
    for path in sorted(DEFAULT_PROFILES_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        gpu = builtin_gpu(data["gpu_key"])
        assert path.name in {name for name, _ in find_profiles(gpu.name, data["kind"])}
        loaded.add(path.name)
        datasets.add(data.get("dataset"))
    others = {p.name for p in DEFAULT_PROFILES_DIR.iterdir() if p.is_file()} - loaded
    assert others and others <= datasets, others - datasets
    for raw in (DEFAULT_PROFILES_DIR / "raw").iterdir():    # h200-raw.json, h200-gpu.log, ...
        stem = raw.name.removesuffix(".log").removesuffix(".json").removesuffix("-raw")
        assert stem.removesuffix("-gpu") + ".json" in loaded, raw.name
    sources = silicon_for(H200).sources
    assert {k: v for k, v in sources.items() if v == "profile:h200.json"} == {}
    assert sources["kv_read"] == "profile:h200-aiconfigurator.json"
