"""Hybrid models' memory as each engine holds it (issue 42): vLLM 0.26.0's one pool of pages
for attention KV and linear-attention state, SGLang 0.5.16's state pool beside its KV pool.

The engines' layouts are checked against the numbers their own source gives for three
hybrids (a KDA, a Gated DeltaNet and a Mamba2 one), and the capacities, state slots and running
limits the model predicts against the start-up logs of the real H200 runs
(``bench/data/h200-real/logs``). Memory is physics, not fitted: a model fitted with a hybrid's
runs and one fitted without them predict the same memory."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine_advisor.calibration.sweep.engine_logs import parse_log
from engine_advisor.model.engines import sglang, vllm
from engine_advisor.model.engines.base import PAGED, SPLIT, HybridShape, MemoryKnobs
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.default import default_model, fitted_rows
from engine_advisor.model.hardware.gpus import builtin_gpu
from engine_advisor.model.physics.capacity import instance_fit, instance_pool
from engine_advisor.model.physics.shape import preset_shape
from engine_advisor.model.queries import evaluate
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload

LOGS = Path(__file__).resolve().parents[2] / "bench" / "data" / "h200-real" / "logs"
H200 = builtin_gpu("H200")


def hybrid(n_full, n_linear, kind, attn, a, conv, ssm, ssm_cache=None, family="hopper"):
    return HybridShape(n_full=n_full, n_linear=n_linear, linear_kind=kind, attention=attn,
                       attn_token_layer_bytes=a, conv_elems=conv, ssm_elems=ssm,
                       ssm_dtype=None, ssm_cache_dtype=ssm_cache, gpu_family=family,
                       gpu_memory_gib=139.8, max_model_len=262_144)


# one layer's state elements: convolution (kernel - 1) x channels, recurrent heads x dk x dv
KIMI_LINEAR = hybrid(7, 20, "kda", "mla", 576 * 2, 3 * 3 * 32 * 128, 32 * 128 * 128)
QWEN3_NEXT = hybrid(12, 36, "gdn", "gqa", 2 * 512 * 2, 3 * 8192, 32 * 128 * 128)
NEMOTRON = hybrid(6, 23, "mamba2", "gqa", 2 * 256 * 2, 3 * 6144, 64 * 64 * 128, "float32")


@pytest.mark.parametrize("shape,block,groups,padding", [
    # Kimi-Linear: the block size the engine logged for the hold-out model, 1,888 tokens
    (KIMI_LINEAR, 1888, (1, 3), "Add 1 padding layers"),
    (QWEN3_NEXT, 544, (1, 3), None),          # GDN state at the model dtype (bf16)
    (NEMOTRON, 2096, (1, 4), "Add 1 padding layers"),   # float32 SSM state
])
def test_vllm_raises_the_attention_block_to_the_state_page(shape, block, groups, padding):
    x = vllm.state_layout(shape)
    assert x.mode == PAGED and x.block_tokens == block
    assert (x.attn_units, x.state_units) == groups
    page = block * shape.attn_token_layer_bytes
    layers = x.unit_bytes / page                        # layers per group
    assert layers == min(shape.n_full, shape.n_linear) and layers == int(layers)
    assert any(n.startswith(f"Setting attention block size to {block} tokens") for n in x.notes)
    assert (padding is None) == (not any(n.startswith("Add ") for n in x.notes))


def test_blackwell_mla_aligns_the_block_to_flashinfer_mla():
    """FlashInfer MLA (Blackwell's default MLA backend) takes blocks of 32 or 64 tokens."""
    x = vllm.state_layout(dataclasses.replace(KIMI_LINEAR, gpu_family="blackwell"))
    assert x.block_tokens == 1888 and x.block_tokens % 32 == 0     # 59 x 32
    y = vllm.state_layout(dataclasses.replace(QWEN3_NEXT, gpu_family="blackwell"))
    assert y.block_tokens == 544                                     # GQA: 16


@pytest.mark.parametrize("shape,per_request", [
    (KIMI_LINEAR, 43_417_600), (QWEN3_NEXT, 77_266_944), (NEMOTRON, 49_082_368)])
def test_sglang_state_slot_is_a_requests_float32_state(shape, per_request):
    x = sglang.state_layout(shape)
    assert x.mode == SPLIT and x.unit_bytes == x.state_bytes == per_request
    assert (x.state_units, x.ratio) == (5, 0.9)


@pytest.fixture(scope="module")
def logs():
    return {tag: parse_log(tag.split("-")[0], (LOGS / f"{tag}.log").read_text())
            for tag in TAGS}


# every hybrid each engine ran: a Mamba2 MoE (Nemotron-3-Nano) and a Gated DeltaNet MoE in FP8
# (Qwen3-Next) on vLLM 0.26.0 and SGLang 0.5.16
TAGS = ("vllm-nemotron-3-nano-30b-a3b", "sglang-nemotron-3-nano-30b-a3b",
        "vllm-qwen3-next-80b-a3b-fp8", "sglang-qwen3-next-80b-a3b-fp8")


@pytest.mark.parametrize("tag", TAGS)
def test_capacity_and_running_limit_within_2_percent_of_the_logs(logs, tag):
    engine, model = tag.split("-", 1)
    facts = logs[tag]
    knobs = MemoryKnobs(max_running=facts.max_running_requested or 0)
    pool = instance_pool(engine, 0.90, H200, preset_shape(model, "bf16"), 1, 1, knobs)
    assert pool.capacity_tokens == pytest.approx(facts.kv_capacity_tokens, rel=0.02)
    assert pool.max_running == pytest.approx(facts.max_running, rel=0.02)
    if engine == "vllm":
        assert pool.layout.block_tokens == facts.block_size
        assert pool.capacity_tokens / 262_144 == pytest.approx(facts.max_concurrency, rel=0.02)
    else:
        assert pool.state_slots == pytest.approx(facts.state_slots, rel=0.02)


def test_memory_is_physics_whatever_the_fit():
    """The same capacity and running sequences from the default model (fitted without the
    Nemotron runs) and from a fit with them."""
    from engine_advisor.model.fit.default import unfitted_rows

    with_it = CostModel.fit(fitted_rows() + [r for r in unfitted_rows()
                                             if r.model.startswith("nemotron")])
    w = Workload(preset="nemotron-3-nano-30b-a3b", gpu="H200", num_gpus=1,
                 context_tokens=131_072, output_tokens=512, batch_size=64)
    for a, b in zip(evaluate(default_model(), w), evaluate(with_it, w), strict=True):
        assert (a.pred.kv_capacity_tokens, a.pred.running_sequences, a.pred.memory_flags) == (
            b.pred.kv_capacity_tokens, b.pred.running_sequences, b.pred.memory_flags)


def test_dcp_stripes_kv_not_state():
    """Kimi-K3 on 8 x B300: DCP 8 multiplies SGLang's KV tokens by 8 and leaves its state
    slots alone; vLLM's pages of a long request shrink by 8 in attention, not in state."""
    shape, gpu = preset_shape("kimi-k3", "bf16"), builtin_gpu("B300")
    s1 = instance_pool("sglang", 0.92, gpu, shape, 8, 1)
    s8 = instance_pool("sglang", 0.92, gpu, shape, 8, 8)
    assert s8.capacity_tokens == 8 * s1.capacity_tokens and s8.state_slots == s1.state_slots
    v1 = instance_pool("vllm", 0.92, gpu, shape, 8, 1)
    v8 = instance_pool("vllm", 0.92, gpu, shape, 8, 8)
    n = 204_800
    assert v8.units_for(n) - v8.fixed_units == pytest.approx(
        (v1.units_for(n) - v1.fixed_units) / 8, abs=1)
    assert v8.fixed_units == v1.fixed_units > 0


def test_a_prediction_reports_its_running_sequences_and_what_binds_them():
    m = default_model()
    w = Workload(preset="qwen3-next-80b-a3b-fp8", gpu="H200", num_gpus=1,
                 context_tokens=1024, output_tokens=128, batch_size=192, engines=["sglang"],
                 requirements={"prefix_reuse_share": 0.5})
    (e,) = evaluate(m, w)
    # prefix reuse asked for: the radix cache stays, five slots per running request; slots
    # sized to the batch take the memory the default split (0.9 : 1) gave to KV it did not
    # need: twice as many run, all the state slots hold
    n = e.pred.running_sequences
    assert 2 * 66 <= n < 192 and e.pred.running_limit == "state"
    assert e.pred.memory_flags == ["--max-mamba-cache-size", str(5 * n),
                                   "--max-running-requests", str(n)]
    assert e.pred.state_slots == 5 * n
    assert e.defaults == (66, e.defaults[1], "state")
    default = instance_fit("sglang", 0.90, H200, preset_shape("qwen3-next-80b-a3b-fp8", "bf16"),
                           1, 1, 192, 1024, 128, share=0.5)
    assert (default.running, default.limit) == (66, "state")


@pytest.mark.parametrize("context,batch,flags", [
    (200_000, 8, ["--disable-radix-cache", "--max-running-requests", "8"]),   # few, long
    (1_000, 200, ["--disable-radix-cache", "--max-running-requests", "200"]),  # many, short
])
def test_the_knob_advice_runs_more_of_the_batch(context, batch, flags):
    """Few long sequences want KV, many short ones state slots: SGLang's default split
    (0.9 : 1, five slots per request) runs fewer of either batch at once than the knobs the
    recommendation proposes, which its launch command carries."""
    m = default_model()
    w = Workload(preset="qwen3-next-80b-a3b-fp8", gpu="H200", num_gpus=1,
                 context_tokens=context, output_tokens=1000, batch_size=batch,
                 engines=["sglang"])
    r = recommend(m, w, "v")
    (p,) = r.predictions
    assert p.memory_flags == flags and r.launch_command[-len(flags):] == flags
    assert p.running_sequences == batch
    default = instance_fit("sglang", p.mem_fraction, H200,
                           preset_shape("qwen3-next-80b-a3b-fp8", "bf16"), 1, 1, batch, context,
                           1000)
    assert default.running < batch
    assert any(x.startswith(" ".join(flags)) and f"holds {default.running} " in x
               for x in r.reasons)
    # the simulator's and nofit's capacity function agrees with the prediction
    advised = instance_fit("sglang", p.mem_fraction, H200,
                           preset_shape("qwen3-next-80b-a3b-fp8", "bf16"), 1, 1, batch, context,
                           1000, advise=True)
    assert advised.running == batch and advised.knobs.no_prefix_cache


def test_vllm_limits_its_running_sequences_to_what_fits_for_a_hybrid():
    m = default_model()
    w = Workload(preset="kimi-k3", gpu="B300", num_gpus=8, context_tokens=204_800,
                 output_tokens=2048, batch_size=64, engines=["vllm"], dcp_sizes=[1])
    (e,) = evaluate(m, w)
    n = e.pred.running_sequences
    assert 1 < n < 64 and e.pred.running_limit == "kv"
    assert e.pred.memory_flags == ["--max-num-seqs", str(n)]
