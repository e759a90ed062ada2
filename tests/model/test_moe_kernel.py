"""Each engine's fused-MoE prefill kernel for a model's experts (``Engine.moe_kernel``,
``engine_advisor.model.physics.moe``): which kernel the engine picks, and that the fits and the
predictions both count it in ``pf_moe``."""

import json

import numpy as np
import pytest

from engine_advisor.model.arch.presets import preset
from engine_advisor.model.engines import sglang
from engine_advisor.model.fit.default import default_model, unfitted_rows
from engine_advisor.model.fit.fitting import observations
from engine_advisor.model.fit.rows import row_case
from engine_advisor.model.physics.features import case_features
from engine_advisor.model.physics.launches import decode_launches
from engine_advisor.model.physics.moe import moe_kernel
from engine_advisor.model.physics.scale import KERNEL_FIXED, PF_MOE
from engine_advisor.model.physics.shape import from_architecture
from engine_advisor.model.predict.predictor import predictor_for
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload


def shape(name: str):
    return from_architecture(preset(name), "bf16")


@pytest.mark.parametrize("name,tp,factor", [
    ("qwen3-30b-a3b", 1, 1.0),             # E=128, N=768: a configuration ships for the H200
    ("qwen3-30b-a3b", 2, 1.0),             # N=384 per rank: one ships too
    ("mixtral-8x7b", 1, 1.0),              # E=8, N=14336
    ("deepseek-v2-lite", 1, sglang.UNTUNED_MOE),          # E=64, N=1408: none ("Using default
    ("nemotron-3-nano-30b-a3b", 1, sglang.UNTUNED_MOE),   # MoE kernel config" in both logs)
    ("qwen3-next-80b-a3b-fp8", 1, sglang.BLOCK_FP8_MOE),  # block-FP8 experts
    ("llama-3.1-8b", 1, 1.0),              # no experts
])
def test_sglang_picks_its_kernel_by_the_configurations_it_ships(name, tp, factor):
    k = moe_kernel("sglang", shape(name), "H200", tp)
    assert k.factor == pytest.approx(factor)
    assert bool(k.note) == (factor != 1.0)


def test_an_untuned_configuration_is_named_in_the_note():
    k = moe_kernel("sglang", shape("nemotron-3-nano-30b-a3b"), "H200", 1)
    assert "E=128,N=1856" in k.note and "H200" in k.note


def test_the_kernels_are_hoppers_only():
    """Blackwell runs other MoE kernels (TensorRT-LLM's, in both engines): the reference."""
    for engine in ("vllm", "sglang", "trtllm"):
        for name in ("nemotron-3-nano-30b-a3b", "qwen3-next-80b-a3b-fp8"):
            assert moe_kernel(engine, shape(name), "B300", 1).factor == 1.0


def test_vllm_runs_block_fp8_experts_slower_and_bf16_ones_alike():
    assert moe_kernel("vllm", shape("qwen3-next-80b-a3b-fp8"), "H200", 1).factor > 1.0
    for name in ("nemotron-3-nano-30b-a3b", "deepseek-v2-lite", "qwen3-30b-a3b"):
        assert moe_kernel("vllm", shape(name), "H200", 1).factor == 1.0


def test_the_shipped_configuration_list_is_sglang_0_5_16s():
    doc = json.loads(sglang.MOE_CONFIGS.read_text())
    assert doc["engine"] == "sglang" and doc["version"] == "0.5.16"
    h200 = set(doc["configs"]["NVIDIA_H200"])
    # what the real 0.5.16's logs said: tuned for Qwen3-30B-A3B and Qwen3-Next (its shared
    # expert fused in as a 513th), untuned for DeepSeek-V2-Lite and Nemotron-3-Nano
    assert {"128,768,bf16", "513,512,fp8_w8a8_block", "8,14336,bf16"} <= h200
    assert not {"64,1408,bf16", "128,1856,bf16"} & h200
    assert "NVIDIA_H100_80GB_HBM3" in doc["configs"]


def test_the_fit_and_the_prediction_count_the_same_kernel():
    """An SGLang row of Nemotron: its observation's pf_moe is the physics times the kernel's
    factor, and the predictor's pf_moe coefficient for it is the engine's times the same; its
    decode step's kernel_fixed is the kernels SGLang launches for it, likewise."""
    row = next(r for r in unfitted_rows()
               if r.model == "nemotron-3-nano-30b-a3b" and r.engine == "sglang")
    case = row_case(row)
    physics = case_features(case).prefill[0][PF_MOE]
    obs = observations([row])
    assert physics > 0
    assert obs.X[obs.qty == 1][0][PF_MOE] == pytest.approx(sglang.UNTUNED_MOE * physics)
    model = default_model()
    level = model.engines[model.level_for("sglang", "H200", case.shape.key)]
    coef = predictor_for(model).coefficients("sglang", "H200", case.shape, 1)[0]
    assert coef[PF_MOE] == pytest.approx(sglang.UNTUNED_MOE * level.coef_[PF_MOE])
    # and the decode step's kernels, the other term an engine scales (physics.scale)
    launches = decode_launches("sglang", case.shape)
    assert obs.X[obs.qty == 2][0][KERNEL_FIXED] == pytest.approx(launches)
    assert coef[KERNEL_FIXED] == pytest.approx(launches * level.coef_[KERNEL_FIXED])
    others = ~np.isin(np.arange(len(coef)), (PF_MOE, KERNEL_FIXED))
    assert np.allclose(coef[others], level.coef_[others])


def test_a_recommendation_says_why_an_engine_prefills_experts_slower():
    model = default_model()
    w = Workload(context_tokens=16_384, output_tokens=256, batch_size=16,
                 preset="nemotron-3-nano-30b-a3b", gpu="H200", num_gpus=1)
    why = recommend(model, w, "v").reasons
    assert any("no tuned fused-MoE configuration" in r and "E=128,N=1856" in r for r in why)
    dense = w.model_copy(update={"preset": "llama-3.1-8b"})
    assert not any("fused-MoE" in r for r in recommend(model, dense, "v").reasons)


def test_sglangs_fused_moe_priors_are_hoppers():
    """SGLang's Triton fused MoE (Hopper) starts at its profiled multiple and the fixed cost
    per call its rows give beside it; Blackwell's kernels start at the physics priors."""
    from engine_advisor.model.fit.estimator import PRIOR
    from engine_advisor.model.fit.fitting import engine_prior

    hopper, blackwell = engine_prior("sglang", "H200"), engine_prior("sglang", "B300")
    assert engine_prior("sglang", "hopper") == hopper == engine_prior("sglang", "H100")
    assert (hopper["pf_moe"], hopper["pf_moe_fixed"]) == (1.5, 0.6e-3)
    assert (blackwell["pf_moe"], blackwell["pf_moe_fixed"]) == (1.0, PRIOR["pf_moe_fixed"])
    assert hopper["pf_ssd"] == blackwell["pf_ssd"] == 19.1     # engine-wide kernel priors
    assert engine_prior("vllm", "H200")["pf_moe"] == 1.0
