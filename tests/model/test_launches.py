"""The kernels a decode step launches (engine_advisor.model.physics.launches): each model's parts,
each engine's kernels per part, and their product against real decode-step profiles."""

import importlib.util
from pathlib import Path

import pytest

from engine_advisor.model.engines import sglang, vllm
from engine_advisor.model.engines.base import DecodeKernels
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.physics.launches import (
    Census,
    census,
    decode_launches,
    profiled_launches,
)
from engine_advisor.model.physics.shape import bare, preset_shape
from engine_advisor.model.physics.terms import TERMS

ROOT = Path(__file__).resolve().parents[2]


def _floors():
    path = ROOT / "bench" / "real_engines" / "decode_floors.py"
    spec = importlib.util.spec_from_file_location("bench_decode_floors", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_census_counts_what_an_engines_table_counts_kernels_of():
    # the product pairs fields by position: the same names, in the same order (the fused-MoE
    # call's own kernels, moe_call, last and not a part: moe_fixed prices them)
    assert Census._fields == DecodeKernels._fields[:-1]
    assert DecodeKernels._fields[-1] == "moe_call"


@pytest.mark.parametrize("name,parts", [
    # 32 layers of attention and a dense feed-forward
    ("llama-3.1-8b", {"sublayer": 64, "attention": 32, "dense_mlp": 32}),
    # Nemotron-H's blocks: 23 Mamba2, 23 MoE with a shared expert, 6 attention, no dense one
    ("nemotron-3-nano-30b-a3b", {"sublayer": 52, "attention": 6, "mamba2": 23, "moe": 23,
                                 "shared_expert": 23}),
    # block-FP8 projections: 2 per attention layer, 3 per Gated DeltaNet layer, 2 per shared
    # expert (the routed experts' own FP8 is the fused-MoE call's)
    ("qwen3-next-80b-a3b-fp8", {"sublayer": 96, "attention": 12, "delta_rule": 36, "moe": 48,
                                "shared_expert": 48, "fp8_gemm": 2 * 12 + 3 * 36 + 2 * 48}),
    # MLA in every layer, the first one's feed-forward dense
    ("deepseek-v2-lite", {"sublayer": 54, "mla": 27, "dense_mlp": 1, "moe": 26,
                          "shared_expert": 26}),
    # the seed's model: 24 MLA and 69 KDA layers
    ("kimi-k3", {"sublayer": 186, "mla": 24, "delta_rule": 69, "dense_mlp": 1, "moe": 92,
                 "shared_expert": 92}),
])
def test_the_census_of_a_model(name, parts):
    got = census(preset_shape(name, "bf16"))._asdict()
    assert got == {**dict.fromkeys(Census._fields, 0.0), "step": 1.0, **parts}


def test_a_bare_shape_counts_one_layer():
    assert census(bare(1000.0)) == Census(sublayer=2, attention=1, mla=0, delta_rule=0,
                                          mamba2=0, dense_mlp=1, moe=0, shared_expert=0,
                                          fp8_gemm=0)


def test_launches_are_each_parts_count_times_its_kernels():
    shape = preset_shape("nemotron-3-nano-30b-a3b", "bf16")
    k = vllm.ENGINE.decode_kernels
    assert decode_launches("vllm", shape) == pytest.approx(
        52 * k.sublayer + 6 * k.attention + 23 * k.mamba2 + 23 * k.moe
        + 23 * k.shared_expert + k.step)
    assert profiled_launches("vllm", shape) == pytest.approx(
        decode_launches("vllm", shape) + 23 * k.moe_call)
    # an engine the model does not know counts with the reference table
    assert decode_launches("some-engine", shape) == pytest.approx(
        52 + 6 * 8 + 23 * 9 + 23 * 3 + 23 * 6 + 20)
    assert sglang.ENGINE.decode_kernels != k


@pytest.mark.parametrize("name,measured", [("llama-3.1-8b", 440), ("qwen3-30b-a3b", 886),
                                           ("deepseek-v2-lite", 795),
                                           ("nemotron-3-nano-30b-a3b", 634)])
def test_the_vllm_table_holds_against_its_decode_profiles(name, measured):
    """vLLM 0.26.0's decode steps on the H200 (bench/data/h200-real/profiles, 1 x 1,024 tokens,
    64 steps): the kernels one step launched, memory copies and sets left out, against the
    table's count for the model (its fused-MoE calls' own kernels included): within 7 %
    (Qwen3's QK norm and Llama's lack of it are one table's attention layer)."""
    got = _floors().measured_launches(ROOT / "bench/data/h200-real/profiles" / f"vllm-{name}")
    assert got == pytest.approx(measured, abs=1)
    assert profiled_launches("vllm", preset_shape(name, "bf16")) == pytest.approx(got, rel=0.07)


def test_the_fits_price_a_kernel_at_a_launch_and_a_tail():
    """The default model's H200 fits: seconds per kernel launched between the floor (half
    the 1.5 us prior) and 2.5 us, what a kernel of a CUDA-graph replay costs on an H200."""
    model = default_model()
    i = TERMS.index("kernel_fixed")
    for engine in ("vllm", "sglang"):
        coef = model.engines[f"{engine}/H200"].coef_[i]
        assert 0.75e-6 - 1e-12 <= coef <= 2.5e-6, (engine, coef)
