"""``calibrate gpu`` on the CPU: the committed H200 profile, its hold-out check, rebuilding it
from the raw measurements, the CLI's errors without a GPU, and the Triton kernel (interpreter)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine_advisor.calibration.kernels.gpu_profile import build_profile, holdout_check, read_rows

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).with_name("engine-advisor")
PROFILES = ROOT / "calibration" / "profiles"
PROFILE = PROFILES / "h200.json"
RAW = PROFILES / "raw" / "h200-raw.json"


@pytest.fixture(scope="module")
def profile() -> dict:
    return json.loads(PROFILE.read_text())


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return read_rows(PROFILES / "h200.csv")


def test_committed_h200_profile_acceptance(profile, rows):
    att = [r for r in rows if r["kind"] == "attention"]
    assert profile["gpu"] == "NVIDIA H200" and profile["gpu_key"] == "H200"
    assert profile["n_points"] == len(att) > 60
    shapes = {r["shape"] for r in att}
    assert len(shapes) >= 3 and profile["n_shapes"] == len(shapes)
    assert {"gqa-8x128", "gqa-4x128", "gqa-1x128", "mla-128h"} <= shapes
    assert all(r["seconds"] > 0 and r["bytes_read"] > 0 for r in att)
    # effective bandwidth as a fraction of the 4.8 TB/s spec
    assert profile["spec_bandwidth_Bps"] == 4.8e12
    frac = profile["kv_read"]["asymptotic_fraction_of_spec"]
    assert 0.5 < frac <= 1.0
    assert frac == pytest.approx(profile["kv_read"]["asymptotic_Bps"] / 4.8e12)
    assert 0.5 < profile["hbm_read"]["peak_fraction_of_spec"] <= 1.0
    eff = profile["effective_bandwidth"]
    assert len(eff["bytes"]) == len(eff["Bps"]) == len(eff["fraction_of_spec"]) > 5
    assert eff["Bps"][-1] > 10 * eff["Bps"][0]      # small reads are overhead-bound
    for key in ("torch", "cuda", "triton"):
        assert profile["software"][key]
    assert profile["date"] and profile["grid"]["batches"] and profile["grid"]["contexts"]
    assert profile["overhead"]["graph-call"] > 0
    assert all(c["all_written"] and c["rel_err"] < 1e-2
               for c in profile["mla_kernel"]["check"].values())


def test_holdout_third_of_grid_within_10_percent(rows, profile):
    h = holdout_check(rows, seed=0)
    print(f"\nhold-out seed 0: {h['n_test']} points, median {h['median_rel_err']:.2%}, "
          f"max {h['max_rel_err']:.2%} ({h['worst_point']})")
    assert h["n_test"] == round(profile["n_points"] / 3)
    assert h["median_rel_err"] < 0.10
    for seed in (1, 2):     # not one lucky split
        other = holdout_check(rows, seed=seed)
        print(f"hold-out seed {seed}: median {other['median_rel_err']:.2%}, "
              f"max {other['max_rel_err']:.2%}")
        assert other["median_rel_err"] < 0.10
    assert profile["holdout"]["median_rel_err"] == pytest.approx(h["median_rel_err"], rel=1e-3)


def test_holdout_detects_a_curve_that_ignores_bytes(rows):
    """The check can fail: shuffling the times against the bytes breaks it."""
    import random

    att = [dict(r) for r in rows if r["kind"] == "attention"]
    times = [r["seconds"] for r in att]
    random.Random(0).shuffle(times)
    for r, t in zip(att, times, strict=True):
        r["seconds"] = t
    assert holdout_check(att)["median_rel_err"] > 0.5


def differences(got, want, where: str = "", rel: float = 1e-6) -> list[str]:
    """Where two JSON values differ: same keys, lengths, strings and integers; floats within
    ``rel`` (the fit's last digits depend on the machine's BLAS and CPU)."""
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{where}: keys {sorted(set(got) ^ set(want))}"]
        return [d for k in want for d in differences(got[k], want[k], f"{where}.{k}", rel)]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items, expected {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in differences(g, w, f"{where}[{i}]", rel)]
    if isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        ok = math.isclose(got, want, rel_tol=rel, abs_tol=1e-300)
        return [] if ok else [f"{where}: {got!r}, expected {want!r}"]
    return [] if got == want and type(got) is type(want) else [f"{where}: {got!r} != {want!r}"]


def test_differences_sees_a_changed_digit_but_not_the_last_one():
    want = {"a": [1.0, 2.5e-6], "n": 3, "s": "x"}
    assert differences({"a": [1.0 + 1e-13, 2.5e-6 * (1 + 1e-12)], "n": 3, "s": "x"}, want) == []
    assert differences({"a": [1.001, 2.5e-6], "n": 3, "s": "x"}, want) == [
        ".a[0]: 1.001, expected 1.0"]
    assert differences({"a": [1.0], "n": 3.0, "s": "x"}, want) == [
        ".a: 1 items, expected 2", ".n: 3.0 != 3"]
    assert differences({"a": [1.0, 2.5e-6], "n": 4, "s": "x"}, want) == [".n: 4 != 3"]


def test_profile_rebuilds_from_the_raw_measurements(profile):
    raw = json.loads(RAW.read_text())
    rebuilt = build_profile(raw["rows"], raw["meta"], dataset_name="h200.csv",
                            command=profile["command"])
    for key in ("n_points", "n_shapes", "kv_read", "shapes", "holdout", "hbm_read", "overhead"):
        assert differences(rebuilt[key], profile[key], key) == []


def test_calibrate_gpu_from_raw_cli(tmp_path):
    out = tmp_path / "lab" / "h200.json"
    r = subprocess.run([str(BIN), "calibrate", "gpu", "--from-raw",
                        str(RAW), "--out", str(out)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "343 attention points over 5 KV shapes" in r.stdout and "hold-out" in r.stdout
    assert json.loads(out.read_text())["kind"] == "gpu-profile"
    n_rows = len(json.loads(RAW.read_text())["rows"])
    assert out.with_suffix(".csv").read_text().count("\n") == n_rows + 1     # header + rows


def _cli(*args, env=None, code=None):
    cmd = ([sys.executable, "-c", code, *args] if code else
           [str(BIN), "calibrate", *args])
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("sub", ["gpu", "dcp"])
def test_calibrate_without_cuda_is_a_clear_error(tmp_path, sub):
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a CUDA device")
    except ImportError:
        pass
    r = _cli(sub, "--out", str(tmp_path / "x.json"))
    assert r.returncode == 2
    assert r.stderr.startswith("engine-advisor: error: ")
    assert "no CUDA device" in r.stderr or "PyTorch is not installed" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("sub", ["gpu", "dcp"])
def test_calibrate_without_torch_names_the_extra(tmp_path, sub):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from engine_advisor.cli.gpu import main; sys.exit(main(sys.argv[1:]))")
    r = _cli(sub, "--out", str(tmp_path / "x.json"), code=code)
    assert r.returncode == 2
    assert "PyTorch is not installed" in r.stderr and "engine-advisor[gpu]" in r.stderr
    assert "Traceback" not in r.stderr


def test_calibrate_gpu_bad_arguments(tmp_path):
    r = _cli("gpu", "--out", str(tmp_path / "x.txt"))
    assert r.returncode == 2 and "--out" in r.stderr and ".json" in r.stderr
    r = _cli("gpu", "--out", str(tmp_path / "x.json"), "--from-raw", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "--from-raw" in r.stderr and "Traceback" not in r.stderr


def test_calibrate_from_raw_of_the_wrong_kind_is_refused(tmp_path):
    raw = tmp_path / "raw.json"
    raw.write_text('{"rows": []}')
    for name, missing in (("gpu", "'meta'"), ("dcp", "'gpu', 'world'")):
        r = _cli(name, "--out", str(tmp_path / "x.json"), "--from-raw", str(raw))
        assert r.returncode == 2 and f"lacks {missing}" in r.stderr
        assert "Traceback" not in r.stderr


INTERPRETER = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import numpy as np
    import torch
    import triton.runtime.interpreter as ti
    # numpy >= 2.4 refuses int() of a 1-element array, which the interpreter does for loop bounds
    _orig = ti._patch_lang_tensor
    def _patched(tensor, scope):
        _orig(tensor, scope)
        scope.set_attr(tensor, "__index__",
                       lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))
    ti._patch_lang_tensor = _patched from engine_advisor.calibration.kernels.mla_decode import
    MlaPlan, mla_decode, mla_decode_reference worst = 0.0 for batch, heads, ctx in ((2, 16, 100),
    (1, 64, 257), (3, 128, 40)):
        q = torch.randn(batch, heads, 576)
        kv = torch.randn(batch, ctx, 576)
        out = torch.full((batch, heads, 512), float("nan"))
        lse = torch.full((batch, heads), float("nan"))
        plan = MlaPlan(batch, heads, ctx, "cpu", block_h=64, block_n=32, target_programs=8)
        assert plan.n_split > 1 or ctx <= 64
        mla_decode(q, kv, 576 ** -0.5, plan, out, lse)
        ref, ref_lse = mla_decode_reference(q, kv, 576 ** -0.5)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        worst = max(worst, float((out - ref).norm() / ref.norm()),
                    float((lse - ref_lse).abs().max()))
    print(worst)
""")


@pytest.mark.slow
def test_mla_triton_kernel_in_the_interpreter():
    """The split-KV kernel (fp32: the interpreter has no bf16 dot) against the reference."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    r = subprocess.run([sys.executable, "-c", INTERPRETER], capture_output=True, text=True,
                       cwd=ROOT, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.strip().splitlines()[-1]) < 1e-5


def test_split_count_fills_the_gpu_without_empty_chunks():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from engine_advisor.calibration.kernels.mla_decode import split_count

    for batch, ctx in ((1, 4096), (1, 262144), (8, 32768), (64, 4096), (64, 262144)):
        s = split_count(batch, 4, 128, ctx, 64, 32, 132)
        assert 1 <= s <= ctx // 64
        if batch == 1:
            assert batch * 4 * s >= 0.9 * 132    # one sequence still fills (nearly) every SM
