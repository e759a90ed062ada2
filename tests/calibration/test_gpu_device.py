"""GPU-only tests of the calibration kernels and timing (skipped without CUDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("dtype,batch,heads,ctx", [
    ("bf16", 3, 128, 5003), ("bf16", 1, 64, 33), ("bf16", 5, 128, 70000), ("fp8", 2, 128, 4099),
])
def test_mla_triton_kernel_matches_reference(dtype, batch, heads, ctx):
    pytest.importorskip("triton")
    from engine_advisor.calibration.kernels.mla_decode import mla_decode, mla_decode_reference

    dt = torch.bfloat16 if dtype == "bf16" else torch.float8_e4m3fn
    q = torch.randn(batch, heads, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(batch, ctx, 576, device="cuda", dtype=torch.bfloat16).to(dt)
    out = torch.full((batch, heads, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((batch, heads), float("nan"), device="cuda")
    mla_decode(q, kv, 576 ** -0.5, None, out, lse)
    ref, ref_lse = mla_decode_reference(q, kv.to(torch.bfloat16), 576 ** -0.5)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()   # every element written
    assert float((out.float() - ref).norm() / ref.norm()) < 1e-2
    assert float((lse - ref_lse).abs().max()) < 2e-2


def test_time_calls_reads_at_hbm_speed():
    from engine_advisor.calibration.kernels.gpu_timing import time_calls

    xs = [torch.rand(2**28, device="cuda") for _ in range(2)]          # 1 GiB each
    r = time_calls([lambda x=x: torch.sum(x) for x in xs], repeats=5)
    bw = 2**30 / r["median_s"]
    assert r["min_s"] <= r["median_s"] <= r["max_s"]
    assert 1e12 < bw < 6e12       # an HBM read, neither a cache hit nor a stall


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_dcp_two_gpus_merged_output_matches_full_attention(tmp_path):
    from engine_advisor.calibration.kernels.dcp_bench import run

    data = run(2, device="cuda", batches=[2], contexts=[8192], message_sizes=[65536],
               repeats=3, workdir=tmp_path)
    for backend in ("ag", "a2a"):
        assert data["checks"]["2"][backend]["rel_err"] < 1e-2
    steps = [r for r in data["rows"] if r["kind"] == "dcp_step"]
    assert {r["backend"] for r in steps} == {"ag", "a2a"}
    assert all(r["attn_s"] > 0 and r["comm_s"] > 0 and r["total_s"] > 0 for r in steps)
