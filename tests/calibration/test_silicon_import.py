"""calibrate import --format aiconfigurator on a fixture in the package's layout and schema."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")

import silicon_fixture as fx  # noqa: E402
from calib_helpers import cli_in_process  # noqa: E402

from engine_advisor.calibration.silicon.importer import build_profile  # noqa: E402
from engine_advisor.calibration.silicon.tables import SiliconError  # noqa: E402
from engine_advisor.model.hardware.gpus import GpuSpec  # noqa: E402
from engine_advisor.model.hardware.profiles import (  # noqa: E402
    PROFILES_ENV,
    clear_profile_cache,
    eval_read_curve,
)
from engine_advisor.model.hardware.silicon import silicon_for  # noqa: E402


@pytest.fixture(scope="module")
def systems(tmp_path_factory):
    return fx.make_systems(tmp_path_factory.mktemp("aic") / "systems")


def run(systems, out, *extra):
    return cli_in_process("calibrate", "import", "--format", "aiconfigurator", "--systems-dir",
                          str(systems), "--out", str(out), *extra)


def test_import_end_to_end(systems, tmp_path):
    out = tmp_path / "profiles" / "fake.json"
    r = run(systems, out, "--system", fx.SYSTEM)
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout
    p = json.loads(out.read_text())
    assert (p["kind"], p["schema_version"], p["gpu"], p["gpu_key"]) == (
        "gpu-profile", 2, fx.DEVICE, "FAKE")
    assert (p["memory_bytes"], p["spec_bandwidth_Bps"]) == (100e9, 6e12)
    src = p["source"]
    assert (src["package"], src["system"], src["engine"], src["engine_version"], src["device"]) \
        == ("aiconfigurator-core", fx.SYSTEM, "sglang", "0.5.14", fx.DEVICE)
    assert len(src["tables"]) == 7
    assert "systems/data/fake_sxm/mla/sglang/0.5.14/generation_mla_perf.parquet" in src["tables"]
    assert "systems/data/fake_sxm/comm/nccl/2.29.2/nccl_perf.parquet" in src["tables"]
    assert src["command"].startswith("engine-advisor calibrate import --format aiconfigurator")

    # default KV read: MLA decode, bf16, the default heads; floor + bytes / bandwidth
    kv = p["kv_read"]
    assert kv["family"] == "mla/bf16" and kv["kernel"] == "trtllm_mla"
    assert kv["heads_per_gpu"] == [8, 16]
    assert kv["asymptotic_Bps"] == pytest.approx(fx.MLA_BW, rel=0.02)
    assert fx.MLA_FLOOR <= kv["overhead_s"] < fx.MLA_FLOOR * 1.05
    b = np.array([1 * 4096, 16 * 16384, 64 * 65536]) * 576 * 2.0    # measured sizes
    assert eval_read_curve(kv, b) == pytest.approx(fx.MLA_FLOOR + b / fx.MLA_BW, rel=0.03)
    mla = p["attention"]["mla"]
    assert set(mla) == {"bf16", "fp8"} and set(mla["bf16"]["by_heads"]) == {"8", "16", "128"}
    assert mla["bf16"]["by_heads"]["128"]["asymptotic_Bps"] == pytest.approx(fx.MLA_BW / 1.25,
                                                                            rel=0.02)
    # fp8 KV: half the bytes per token, same bytes/s
    assert mla["fp8"]["asymptotic_Bps"] == pytest.approx(fx.MLA_BW, rel=0.02)

    # GQA decode: the fused kernel over the GQA shapes (not Triton, MHA or sliding windows)
    gqa = p["attention"]["gqa"]
    assert gqa["bf16"]["kernel"] == "trtllm_mha" and gqa["fp8"]["kernel"] == "trtllm_mha"
    for d in ("bf16", "fp8"):
        assert gqa[d]["asymptotic_Bps"] == pytest.approx(fx.GQA_BW, rel=0.02)
        assert gqa[d]["peak_Bps"] < fx.GQA_BW

    ctx = p["context_attention"]
    assert ctx["mla"]["bf16"]["achievable_flops"] == pytest.approx(fx.CTX_MLA_FLOPS, rel=1e-9)
    assert (ctx["mla"]["bf16"]["qk_dim"], ctx["mla"]["bf16"]["v_dim"]) == (192, 128)
    assert ctx["gqa"]["bf16"]["achievable_flops"] == pytest.approx(fx.CTX_GQA_FLOPS, rel=1e-9)
    assert ctx["gqa"]["fp8"]["kernel"] == "trtllm_mha"

    g = p["gemm"]["bfloat16"]
    rows = fx.gemm_rows()
    sec = np.array([r["latency"] for r in rows]) * 1e-3
    m, n, k = (np.array([r[c] for r in rows], dtype=float) for c in "mnk")
    big, small = m >= 4096, (m <= 16) & (n * k >= 2**26)
    assert g["achievable_flops"] == pytest.approx(np.median((2 * m * n * k / sec)[big]))
    assert g["weight_read_Bps"] == pytest.approx(np.median((n * k * 2 / sec)[small]))
    assert g["overhead_s"] == pytest.approx(sec.min())
    assert g["n_points"] == int(big.sum())

    coll = p["collectives"]
    for op, (lat, bw) in fx.NCCL.items():
        assert set(coll[op]) == {"2", "4", "8"}
        for n_gpus, c in coll[op].items():
            assert c["latency_s"] == pytest.approx(lat * (1 + int(n_gpus) / 16), rel=1e-6)
            assert c["bandwidth_Bps"] == pytest.approx(bw, rel=1e-6)
            assert c["n_points"] == len(fx._sizes())
    car = coll["custom_all_reduce"]
    assert car["kernel"] == "SGLang_CustomAllReduce_graph"
    assert car["8"]["latency_s"] == pytest.approx(fx.CUSTOM_AR[0], rel=1e-6)
    assert car["8"]["bandwidth_Bps"] == pytest.approx(fx.CUSTOM_AR[1], rel=1e-6)


def test_the_model_loads_an_imported_profile(systems, tmp_path, monkeypatch):
    out = tmp_path / "fake.json"
    assert run(systems, out, "--system", fx.SYSTEM).returncode == 0
    monkeypatch.setenv(PROFILES_ENV, str(tmp_path))
    clear_profile_cache()
    try:
        si = silicon_for(GpuSpec(name="FAKE", memory_bytes=100e9, hbm_bandwidth=6e12))
        assert si.read_source("mla", "bf16") == "profile:fake.json"
        assert si.attn_read_s("mla", "bf16", np.array([2e9]))[0] == pytest.approx(
            fx.MLA_FLOOR + 2e9 / fx.MLA_BW, rel=0.05)
    finally:
        clear_profile_cache()


@pytest.mark.parametrize("args,message", [
    (["--system", "nope_sxm"], "--system: no system 'nope_sxm' in "),
    (["--system", "nope_sxm"], "; systems: fake_sxm"),
    (["--system", fx.SYSTEM, "--engine", "vllm"],
     "--engine: fake_sxm has no mla/vllm/*/generation_mla_perf.parquet; engines with it: "
     "sglang"),
    (["--system", fx.SYSTEM, "--engine-version", "0.5.99"],
     "--engine-version: fake_sxm has no mla/sglang/0.5.99/generation_mla_perf.parquet; "
     "versions with it: 0.5.14"),
    ([], "--system: required with --format aiconfigurator"),
    (["--system", fx.SYSTEM, "extra.json"], "takes no FILE arguments"),
])
def test_bad_arguments_exit_2_and_write_nothing(systems, tmp_path, args, message):
    out = tmp_path / "out.json"
    r = run(systems, out, *args)
    assert r.returncode == 2
    assert r.stderr.startswith("engine-advisor: error: ")
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


def _broken_copy(src, dst, table, rows, drop=()):
    import shutil

    shutil.copytree(src, dst)
    fx.write_table(fx.table_path(dst, table), table, rows, drop)
    return dst


@pytest.mark.parametrize("table,rows,drop,message", [
    ("gemm_perf", [], (), "table systems/data/fake_sxm/gemm/sglang/0.5.14/gemm_perf.parquet "
                          "has no rows with a positive latency"),
    ("generation_mla_perf", fx.mla_rows(), ("step", "latency"),
     "generation_mla_perf.parquet lacks column(s) step, latency (has: framework"),
    ("generation_mla_perf", [r for r in fx.mla_rows() if r["kv_cache_dtype"] == "fp8"], (),
     "has no bf16-KV rows"),
    ("nccl_perf", [{**r, "latency": -1.0} for r in fx.nccl_rows()], (),
     "nccl_perf.parquet has no rows with a positive latency"),
])
def test_bad_tables_leave_the_output_untouched(systems, tmp_path, table, rows, drop, message):
    broken = _broken_copy(systems, tmp_path / "systems", table, rows, drop)
    out = tmp_path / "b300.json"
    out.write_text('{"kept": true}\n')
    r = run(broken, out, "--system", fx.SYSTEM)
    assert r.returncode == 2, r.stdout
    assert message in r.stderr
    assert out.read_text() == '{"kept": true}\n'
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["b300.json"]


def test_missing_package_is_named(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "aiconfigurator_core" else real(name, *a))
    with pytest.raises(SiliconError, match=r"engine-advisor\[silicon\]"):
        build_profile("b300_sxm")


@pytest.mark.parametrize("args,message", [
    (["--kv-bytes-per-token", "70272"], "FILE: at least one benchmark file is required"),
    (["UNKNOWN"], "--kv-bytes-per-token: required: the served model 'some-org/unknown-model' "
                  "names no known architecture"),
])
def test_bench_formats_still_need_files_and_kv_bytes(tmp_path, args, message):
    """KV bytes: from the architecture the file's model id names, else required."""
    unknown = tmp_path / "unknown.json"
    obj = json.loads((Path(__file__).parent / "data" / "vllm_bench_8k_c8.json").read_text())
    unknown.write_text(json.dumps({**obj, "model_id": "some-org/unknown-model"}))
    args = [str(unknown) if a == "UNKNOWN" else a for a in args]
    r = cli_in_process("calibrate", "import", "--format", "vllm-bench", "--out",
                       str(tmp_path / "d.csv"), *args)
    assert r.returncode == 2 and message in r.stderr


def test_trtllm_mla_prefill_is_counted_in_its_non_absorbed_form():
    """TensorRT-LLM's context MLA expands the latent KV per head (qk 192, v 128) whatever its
    table's kernel_source says: counted absorbed (576, 512), its H200 rows would run at twice
    the GPU's dense bf16 peak."""
    from engine_advisor.calibration.silicon.physics import mla_prefill
    n = 4
    t = {"kernel_source": np.array(["default"] * n), "isl": np.full(n, 8192.0),
         "num_heads": np.full(n, 16.0), "batch_size": np.full(n, 2.0),
         "kv_cache_dtype": np.array(["bfloat16"] * n), "latency": np.full(n, 4.0)}
    trt, other = mla_prefill(t, "trtllm")["bf16"], mla_prefill(t, "sglang")["bf16"]
    assert (trt["qk_dim"], trt["v_dim"]) == (192, 128)
    assert (other["qk_dim"], other["v_dim"]) == (576, 512)
    flops = 2 * 16 * (192 + 128) * 8192**2
    assert trt["achievable_flops"] == pytest.approx(flops / 4e-3)


def _moe_table(shapes, floor):
    """moe_perf rows at one token and no expert parallelism, TP 1 and 8, each taking
    ``floor(experts)`` beyond its experts' bytes at 8 TB/s."""
    cols = {k: [] for k in ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk",
                            "num_experts", "moe_tp_size", "moe_ep_size", "latency")}
    for dtype, e, h, inter, k in shapes:
        for tp in (1, 8):
            nbytes = k * 3 * h * inter / tp * {"bfloat16": 2.0, "fp8_block": 1.0}[dtype]
            row = (dtype, 1.0, h, inter, k, e, tp, 1.0, (floor(dtype, e) + nbytes / 8e12) * 1e3)
            for key, v in zip(cols, row, strict=True):
                cols[key].append(v)
    return {k: np.array(v) for k, v in cols.items()}


def test_the_fused_moe_floor_is_fitted_per_format_and_a_bent_one_left_out():
    """One fused-MoE call's floor at one token, less its experts' bytes: a line in the number
    of experts per format (``moe_floor``); a format whose floors are not a line is left out."""
    from engine_advisor.calibration.silicon.physics import moe_floor
    shapes = [(d, e, 4096, 1024, 8) for d in ("bfloat16", "fp8_block")
              for e in (8, 64, 128, 256, 512)]

    def floor(dtype, e):
        if dtype == "fp8_block":
            return 24e-6 + 0.25e-6 * e
        return 15e-6 if e <= 256 else 100e-6         # a kernel that steps up past 256

    fits = moe_floor(_moe_table(shapes, floor), 8e12)
    assert set(fits) == {"fp8_block"}
    f = fits["fp8_block"]
    assert f["base_s"] == pytest.approx(24e-6, rel=1e-6)
    assert f["per_expert_s"] == pytest.approx(0.25e-6, rel=1e-6)
    assert f["experts_range"] == [8, 512] and f["n_shapes"] == 5
    flat = moe_floor(_moe_table(shapes, lambda d, e: 30e-6), 8e12)
    assert flat["bf16"]["per_expert_s"] == pytest.approx(0.0, abs=1e-15)
    assert flat["bf16"]["base_s"] == pytest.approx(30e-6, rel=1e-6)
