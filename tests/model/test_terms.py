"""Each physical term of engine_advisor.model.physics.terms in seconds, against hand-computed
values."""

import dataclasses

import numpy as np
import pytest

from engine_advisor.model.engines import get as engine
from engine_advisor.model.formulas.terms import CHUNK_TOKENS
from engine_advisor.model.hardware.gpus import GpuSpec
from engine_advisor.model.hardware.silicon import SPEC_EFFICIENCY, Silicon
from engine_advisor.model.physics.capacity import instance_fit, instance_pool
from engine_advisor.model.physics.features import Case, case_features
from engine_advisor.model.physics.memory import DEFAULT_ACTIVATION
from engine_advisor.model.physics.shape import bare
from engine_advisor.model.physics.terms import (
    DECODE_TERMS,
    PREFILL_TERMS,
    Hardware,
    decode_terms,
    prefill_terms,
)

GPU = GpuSpec(name="TESTGPU", memory_bytes=100e9, hbm_bandwidth=4e12, nvlink_bandwidth=800e9,
              flops_bf16=1e15, flops_fp8=2e15)
SI = Silicon(GPU)
HBM = 4e12 * SPEC_EFFICIENCY["hbm"]
FLOPS = 1e15 * SPEC_EFFICIENCY["gemm"]

# A small MoE MLA model: 10 layers (8 MLA, 2 linear), 64 experts, 4 per token.
SHAPE = dataclasses.replace(
    bare(8 * 1152), name="toy", key="toy@0", attention="mla", n_layers=10, n_full_layers=8,
    n_linear_layers=2, kv_layer_bytes=1152.0, kv_heads=1, q_heads=16, hidden_size=2048,
    qk_dim=576, v_dim=512, state_bytes_per_seq=2 * 16 * 128 * 128 * 4.0, weight_bytes=20e9,
    dense_step_bytes=2e9, n_moe_layers=9, n_experts=64, experts_per_token=4, expert_bytes=30e6,
    matmul_flops=(("bf16", 2 * 3e9),), attn_flops_per_ctx_token=8 * 16 * (2 * 576 + 2 * 512),
    attn_prefill_coef=8 * 16 * (192 + 128), weights_known=True)


def col(row, name, names=DECODE_TERMS):
    return np.asarray(row[names.index(name)])


def test_weights_at_batch_one_read_dense_and_k_experts_per_layer():
    f = decode_terms(SHAPE, Hardware(SI, 2), 1.0, 1000.0, 1.0)
    assert float(col(f, "gemm")[()]) == pytest.approx(2e9 / 2 / HBM, rel=1e-9)
    # one token touches exactly k experts of each MoE layer (their own kernels: the moe term)
    assert float(col(f, "moe")[()]) == pytest.approx(9 * 4 * 30e6 / 2 / HBM, rel=1e-9)


def test_expected_experts_touched_saturates_at_all_experts():
    touched = SHAPE.experts_touched(np.array([1, 16, 4096]))
    assert touched[0] == pytest.approx(4.0)
    assert touched[1] == pytest.approx(64 * (1 - (1 - 4 / 64) ** 16))
    assert touched[2] == pytest.approx(64.0, rel=1e-6)


def test_gemm_turns_compute_bound_at_large_batch():
    hw = Hardware(SI, 1)
    big = 1_000_000.0
    f = decode_terms(SHAPE, hw, big, 10.0, 1.0)
    assert float(col(f, "gemm")[()]) == pytest.approx(big * 6e9 / FLOPS, rel=1e-9)


def test_kv_read_is_one_call_per_full_attention_layer():
    """A measured per-call curve with a fixed overhead: 8 calls of b/8 bytes, not one call."""
    curve = {"bytes": [1e6, 1e9], "seconds": [20e-6, 1e-3], "overhead_s": 10e-6,
             "asymptotic_Bps": 1e12, "n_points": 2}
    si = Silicon(GPU, [("p.json", {"attention": {"mla": {"bf16": curve}}})])
    batch, ctx = 4.0, 10_000.0
    f = decode_terms(SHAPE, Hardware(si, 8), batch, ctx, 1.0)
    per_call = batch * ctx * 1152.0
    assert float(col(f, "mla_read")[()]) == pytest.approx(8 * si.attn_read_s("mla", "bf16",
                                                                              per_call), rel=1e-9)
    assert float(col(f, "kv_read")[()]) == 0.0      # the MLA latent has its own term
    assert si.read_source("mla", "bf16") == "profile:p.json"


def test_dcp_divides_kv_reads_and_adds_collectives():
    hw = Hardware(SI, 8)
    f1 = decode_terms(SHAPE, hw, 32.0, 100_000.0, 1.0)
    f8 = decode_terms(SHAPE, hw, 32.0, 100_000.0, 8.0)
    assert float(col(f8, "kv_read")[()]) == pytest.approx(float(col(f1, "kv_read")[()]) / 8,
                                                          rel=1e-6)
    assert float(col(f1, "dcp_comm")[()]) == 0.0
    assert float(col(f8, "dcp_comm")[()]) > 0.0
    f8b = decode_terms(SHAPE, hw, 64.0, 100_000.0, 8.0)
    assert float(col(f8b, "dcp_comm")[()]) > float(col(f8, "dcp_comm")[()])


def test_spec_collectives_ring_formula():
    bw = 800e9          # nvlink_bandwidth is per direction
    nbytes = 1e6
    assert float(SI.all_reduce_s(nbytes, 8)) == pytest.approx(8e-6 + 2 * 7 / 8 * nbytes / bw)
    assert float(SI.all_reduce_s(nbytes, 1)) == 0.0
    assert float(SI.all_gather_s(nbytes, 4)) == pytest.approx(8e-6 + 3 / 4 * nbytes / bw)


def test_tp_all_reduce_two_per_layer_and_zero_without_tp():
    f1 = decode_terms(SHAPE, Hardware(SI, 1), 8.0, 1000.0, 1.0)
    f4 = decode_terms(SHAPE, Hardware(SI, 4), 8.0, 1000.0, 1.0)
    assert float(col(f1, "tp_comm")[()]) == 0.0
    assert float(col(f4, "tp_comm")[()]) == pytest.approx(
        2 * 10 * float(SI.all_reduce_s(8 * 2048 * 2, 4)))


def test_linear_attention_state_is_read_and_written_per_sequence():
    f = decode_terms(SHAPE, Hardware(SI, 2), 16.0, 1000.0, 1.0)
    assert float(col(f, "state")[()]) == pytest.approx(2 * 16 * SHAPE.state_bytes_per_seq / 2
                                                        / SI.stream_Bps)
    # an engine's own state bytes (its dtypes) replace the model's
    g = decode_terms(SHAPE, Hardware(SI, 2), 16.0, 1000.0, 1.0, state_bytes=1e6)
    assert float(col(g, "state")[()]) == pytest.approx(2 * 16 * 1e6 / SI.stream_Bps)


def test_counts_for_fixed_costs():
    f = decode_terms(SHAPE, Hardware(SI, 2), 16.0, 1000.0, 1.0)
    # one step's kernels: the engine's count for the model scales it (physics.scale)
    assert float(col(f, "kernel_fixed")[()]) == 1
    assert float(col(f, "seq_fixed")[()]) == 16
    assert float(col(f, "step_fixed")[()]) == 1


def test_prefill_flops_attention_and_prefix_reuse():
    hw = Hardware(SI, 4)
    L, b = 32_768.0, 4.0
    f = prefill_terms(SHAPE, hw, b, L, 0.0)
    new = b * L
    chunks = np.ceil(new / CHUNK_TOKENS)
    gemm = chunks * max(new / chunks * 6e9 / 4 / FLOPS, 20e9 / 4 / HBM)
    assert float(col(f, "pf_gemm", PREFILL_TERMS)[()]) == pytest.approx(gemm, rel=1e-9)
    attn = SHAPE.attn_prefill_coef * L ** 2 * b / 4 / (1e15 * SPEC_EFFICIENCY["attn"])
    # an MLA model's full-attention prefill is MLA's own term
    assert float(col(f, "pf_mla", PREFILL_TERMS)[()]) == pytest.approx(attn, rel=1e-9)
    assert float(col(f, "pf_attn", PREFILL_TERMS)[()]) == 0.0
    # half of each prompt cached (computed once): attention of the others scales as 1 - s^2
    g = prefill_terms(SHAPE, hw, b, L, 0.5)
    ratio = float(col(g, "pf_mla", PREFILL_TERMS)[()]) / float(col(f, "pf_mla",
                                                                     PREFILL_TERMS)[()])
    assert ratio == pytest.approx((1 + (b - 1) * (1 - 0.25)) / b)
    assert float(col(g, "pf_fixed", PREFILL_TERMS)[()]) < float(col(f, "pf_fixed",
                                                                      PREFILL_TERMS)[()])


def test_a_prefill_pass_replayed_as_a_cuda_graph_pays_no_launch_costs():
    """Passes of up to ``graph_tokens`` tokens replay a captured graph: no per-layer or per
    fused-MoE-call fixed cost; a larger pass is launched kernel by kernel and pays both, once
    per layer (MoE layer) and pass. The bytes and FLOPs are the same either way."""
    hw = Hardware(SI, 1)
    eager = prefill_terms(SHAPE, hw, 1.0, 1024.0)
    graphed = prefill_terms(SHAPE, hw, 1.0, 1024.0, graph_tokens=8192)
    small_graph = prefill_terms(SHAPE, hw, 1.0, 1024.0, graph_tokens=512)
    assert float(col(eager, "pf_fixed", PREFILL_TERMS)[()]) == SHAPE.n_layers
    assert float(col(eager, "pf_moe_fixed", PREFILL_TERMS)[()]) == SHAPE.n_moe_layers
    for t in ("pf_fixed", "pf_moe_fixed"):
        assert float(col(graphed, t, PREFILL_TERMS)[()]) == 0.0
    assert small_graph == eager
    for t in ("pf_gemm", "pf_moe", "pf_mla", "pf_comm", "pf_batch"):
        assert col(graphed, t, PREFILL_TERMS) == col(eager, t, PREFILL_TERMS)
    # 4 prompts of 8,192 tokens: four full passes, each at most a graph's size
    four = prefill_terms(SHAPE, hw, 4.0, 8192.0, graph_tokens=8192)
    assert float(col(four, "pf_fixed", PREFILL_TERMS)[()]) == 0.0


def test_which_engine_graphs_which_prefill():
    """SGLang 0.5.16 captures prefill passes up to 8,192 tokens except for MLA models; vLLM
    0.26.0 captures mixed batches up to 512 tokens for every attention kind."""
    assert engine("sglang").graphed_prefill_tokens("gqa") == 8192
    assert engine("sglang").graphed_prefill_tokens("mla") == 0
    assert engine("vllm").graphed_prefill_tokens("gqa") == 512
    assert engine("vllm").graphed_prefill_tokens("mla") == 512
    gqa = dataclasses.replace(SHAPE, attention="gqa", key="toy-gqa@0")
    f = case_features(Case(gqa, SI, 1, ["vllm", "sglang"], [1.0, 1.0], [1024.0, 1024.0],
                           [2.0, 2.0], [1.0, 1.0], [0.9, 0.9]))
    moe_fixed = PREFILL_TERMS.index("pf_moe_fixed")
    assert f.prefill[0, moe_fixed] == SHAPE.n_moe_layers      # vLLM: 1,024 > 512 tokens
    assert f.prefill[1, moe_fixed] == 0.0                      # SGLang: in a graph


def test_prefill_attention_of_gqa_and_of_windows_is_pf_attn():
    """The same FLOPs on a GQA model land in ``pf_attn``; an MLA model's window-bounded or
    linear-attention layers (``x L``) stay there too: only MLA's own layers are ``pf_mla``."""
    hw = Hardware(SI, 4)
    L, b = 32_768.0, 4.0
    gqa = dataclasses.replace(SHAPE, attention="gqa", key="toy-gqa@0")
    f = prefill_terms(gqa, hw, b, L, 0.0)
    attn = SHAPE.attn_prefill_coef * L ** 2 * b / 4 / (1e15 * SPEC_EFFICIENCY["attn"])
    assert float(col(f, "pf_attn", PREFILL_TERMS)[()]) == pytest.approx(attn, rel=1e-9)
    assert float(col(f, "pf_mla", PREFILL_TERMS)[()]) == 0.0
    windows = dataclasses.replace(SHAPE, key="toy-win@0", attn_prefill_linear=1e6)
    w = prefill_terms(windows, hw, b, L, 0.0)
    assert float(col(w, "pf_attn", PREFILL_TERMS)[()]) == pytest.approx(
        1e6 * b * L / 4 / (1e15 * SPEC_EFFICIENCY["attn"]), rel=1e-9)
    assert float(col(w, "pf_mla", PREFILL_TERMS)[()]) == pytest.approx(attn, rel=1e-9)


def test_capacity_counts_weights_and_vllm_reserve():
    """KV of 1,000 B per token on 4 GPUs of 100 GB, 40 GB of weights, DCP 2: each GPU holds a
    quarter of the weights and half of every token's KV; vLLM's budget also holds the
    activation peak (1.1 GiB without an architecture), SGLang's does not."""
    gpu = GpuSpec(name="TOY", memory_bytes=100e9, hbm_bandwidth=4e12, flops_bf16=1e15)
    shape = bare(1000.0, weight_bytes=40e9)
    cap_v = instance_pool("vllm", 0.9, gpu, shape, 4, 2).capacity_tokens
    cap_s = instance_pool("sglang", 0.9, gpu, shape, 4, 2).capacity_tokens
    assert cap_v == int((0.9 * 100e9 - engine("vllm").reserve_bytes - DEFAULT_ACTIVATION
                         - 10e9) / 500.0)
    assert cap_s == int((0.90 * 100e9 - engine("sglang").reserve_bytes - 10e9) / 500.0)
    heavy = dataclasses.replace(shape, weight_bytes=400e9)
    assert instance_pool("sglang", 0.1, gpu, heavy, 4, 1).capacity_tokens == 0


def test_sequences_at_once_and_shared_prefix():
    gpu = GpuSpec(name="TOY", memory_bytes=100e9, hbm_bandwidth=4e12, flops_bf16=1e15)
    shape = bare(1000.0, weight_bytes=40e9)
    cap = instance_pool("sglang", 0.9, gpu, shape, 1, 1).capacity_tokens
    fit = instance_fit("sglang", 0.9, gpu, shape, 1, 1, 64, cap // 100 - 10, 10)
    assert (fit.running, fit.fits_all, fit.limit) == (64, True, "none")
    fit = instance_fit("sglang", 0.9, gpu, shape, 1, 1, 64, cap // 10 - 10, 10)
    assert (fit.running, fit.fits_all, fit.limit) == (10, False, "kv")
    # a prompt shared 90 %: held once, each sequence adds its tenth and its output
    c = cap // 10
    fit = instance_fit("sglang", 0.9, gpu, shape, 1, 1, 64, c, 10, share=0.9)
    assert fit.running == min(64, (cap - int(0.9 * c)) // (c - int(0.9 * c) + 10))


def test_a_batch_that_does_not_fit_is_admitted_as_running_sequences_finish():
    """Continuous batching: `run` sequences at once, the rest admitted one by one as running
    ones finish, so `run` decode for 64 x 100 / run steps, no staircase of whole waves; every
    prompt is prefilled once, the TTFT is the first `run`'s prefill."""
    gpu = GpuSpec(name="SMALL", memory_bytes=30e9, hbm_bandwidth=4e12, flops_bf16=1e15)
    case = Case(SHAPE, Silicon(gpu), 1, np.array(["sglang", "sglang"]), np.array([64.0, 64.0]),
                np.array([100_000.0, 100_000.0]), np.array([101.0, 101.0]), np.array([1.0, 1.0]),
                np.array([0.9, 0.9]))
    f = case_features(case)
    run = int(f.running[0])
    assert 1 <= run < 64
    assert f.total[0, -1] == pytest.approx(100 * 64 / run)        # step_fixed counts steps
    one = case_features(dataclasses.replace(case, batch=np.array([float(run)] * 2)))
    rest = case_features(dataclasses.replace(case, batch=np.array([float(64 - run)] * 2)))
    pf = PREFILL_TERMS.index("pf_fixed")
    assert f.total[0, pf] == pytest.approx(one.total[0, pf] + rest.total[0, pf])  # passes
    assert f.prefill[0, pf] == pytest.approx(one.total[0, pf])   # TTFT: the first ones only
    assert f.total[0, PREFILL_TERMS.index("pf_batch")] == 2
    # smooth in the batch: one more sequence costs about one sequence's share of the steps
    more = case_features(dataclasses.replace(case, batch=np.array([65.0, 65.0])))
    assert more.total[0, -1] == pytest.approx(100 * 65 / run)




def test_dcp_read_is_looked_up_at_the_gathered_heads():
    """Under DCP d each rank runs d x the query heads (the gathered queries) over c / d
    tokens: its read is the per-call curve at d x the heads per rank, the engine-kernel
    tables' measured slowdown of 128 heads over 16 (DeepSeek-V3: 128 heads, TP 8, DCP 8, on
    B200, where the read, not the FLOPs, bounds the call at 64 x 128K)."""
    from engine_advisor.model.formulas.layout import ATTN_CALL, KV_CALL, N_FULL
    from engine_advisor.model.hardware.gpus import builtin_gpu
    from engine_advisor.model.hardware.profiles import ReadCurve
    from engine_advisor.model.hardware.silicon import silicon_for
    from engine_advisor.model.physics.shape import preset_shape
    from engine_advisor.model.physics.terms import physics_for

    shape = preset_shape("deepseek-v3", "bf16")
    si = silicon_for(builtin_gpu("B200"))
    ph = physics_for(shape, si, 8)
    by_heads = si._curves[si._curve_key("mla", "bf16")]["by_heads"]
    b, c, d = 64, 131072.0, 8
    x = b * c / d * ph.K[KV_CALL]                       # bytes one rank reads per layer
    measured = ReadCurve(by_heads["128"])(x) / ReadCurve(by_heads["16"])(x)
    assert measured > 1.15                              # 128 heads read slower than 16
    ratio = float(si.heads_ratio("mla", "bf16", 128 / 8, 128, np.array([x]))[0])
    assert ratio == pytest.approx(measured, rel=1e-9)
    base = si.read_curve("mla", "bf16")(x)              # the curve at 16 heads per rank
    assert b * c * ph.K[ATTN_CALL] < base * ratio       # the read, not the FLOPs, bounds it
    dcp_read = col(ph.decode(b, c, d), "dcp_read")
    assert float(dcp_read) == pytest.approx(ph.K[N_FULL] * base * ratio, rel=0.03)
    # without DCP the same bytes at 16 heads per rank: the base curve, no slowdown
    mla = col(ph.decode(b, c / d, 1), "mla_read")
    assert float(mla) == pytest.approx(ph.K[N_FULL] * base, rel=1e-9)
    # a profile that measured one head count only: heads do not matter, one level
    assert ph.curve.shape[0] == 9 and physics_for(shape, silicon_for(builtin_gpu("H20")),
                                                  8).curve.shape[0] == 1
