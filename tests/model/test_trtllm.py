"""TensorRT-LLM (``trtllm``): its free-memory fraction, launch command and ``--config`` YAML,
Helix only where it applies, predictions marked uncalibrated with a reason, and an engine a
workload must name."""

from __future__ import annotations

import math

import pytest
import yaml

from engine_advisor.model import engines
from engine_advisor.model.engines import trtllm
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.predict.capabilities import engine_exclusion
from engine_advisor.model.presentation.launch import flag_value, used_before_kv
from engine_advisor.model.queries import evaluate
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Config, Requirements, Workload

GIB = 2 ** 30
CONFIG = "/etc/trtllm/extra-llm-api-config.yml"


def llama(**kw) -> Workload:
    return Workload(**{"context_tokens": 8192, "output_tokens": 512, "batch_size": 16,
                       "preset": "llama-3.1-70b", "gpu": "H200", "model": "meta-llama/L-70B",
                       **kw})


def kimi(context: int = 65536, **kw) -> Workload:
    return Workload(**{"context_tokens": context, "output_tokens": 2048, "batch_size": 64,
                       "preset": "kimi-k3", "gpu": "B300", **kw})


# ------------------------------------------------------------------ the free-memory fraction
def test_free_fraction_gives_the_whole_gpu_fractions_kv_budget():
    mem, used = 141e9, 30e9
    free = trtllm.free_fraction(0.92, mem, used)
    assert free == pytest.approx((0.92 * 141 - 30) / (141 - 30))
    # TensorRT-LLM's rule with the converted share leaves the KV what 0.92 of the GPU leaves
    assert trtllm.kv_budget(free, mem, used) == pytest.approx(0.92 * mem - used)
    # the share of the free memory is below the share of the GPU whenever anything is used
    assert free < 0.92 and trtllm.free_fraction(0.92, mem, 0.0) == pytest.approx(0.92)


@pytest.mark.parametrize("fraction,used,want", [
    (0.90, 200e9, 0.0),        # the weights alone exceed 0.9 of the GPU: no KV at all
    (0.90, 141e9, 0.0),        # nothing free
    (1.00, 30e9, 1.0),
])
def test_free_fraction_stays_within_0_and_1(fraction, used, want):
    assert trtllm.free_fraction(fraction, 141e9, used) == want


def test_the_cost_models_kv_capacity_is_trtllms_rule_at_the_converted_flag():
    """The capacity predicted for trtllm is TensorRT-LLM's budget at the flag the launch command
    carries (free share x memory free after weights, reserve and activations), per token."""
    w = llama()
    shape = w.model_shape()
    (e,) = evaluate(default_model(), w, [Config("trtllm", 1)])
    p = e.pred
    mem = w.gpu_spec().memory_bytes
    used = used_before_kv("trtllm", w, shape, p.memory_flags)
    assert used > shape.weight_bytes / 8 + 1.0 * GIB          # weights, reserve, activations
    free = trtllm.free_fraction(p.mem_fraction, mem, used)
    want = trtllm.kv_budget(free, mem, used) / shape.kv_gpu_token_bytes(8)
    assert p.kv_capacity_tokens == pytest.approx(want, rel=1e-6)
    assert flag_value("trtllm", p.mem_fraction, w, shape, p.memory_flags) == round(free, 2)
    # vLLM's and SGLang's flags take the whole-GPU fraction as it is
    assert flag_value("vllm", 0.92, w, shape) == 0.92


# ------------------------------------------------------------------ the recommendation
def test_trtllm_is_ranked_beside_vllm_and_sglang_with_its_own_launch_command():
    m = default_model()
    rec = recommend(m, llama(engines=["vllm", "sglang", "trtllm"]), m.version)
    assert {p.engine for p in rec.predictions} == {"vllm", "sglang", "trtllm"}
    for p in rec.predictions:
        if p.engine == "trtllm":
            assert p.calibrated is False and "physics priors" in p.calibration_note
        else:
            assert p.calibration_note is None
    assert any(r.startswith("trtllm calibrated: false: TensorRT-LLM cannot be installed here")
               for r in rec.reasons)


def test_a_trtllm_recommendation_carries_its_free_memory_fraction_and_config():
    m = default_model()
    w = llama(engines=["trtllm"], kv_cache_dtype="fp8")
    rec = recommend(m, w, m.version)
    assert (rec.engine, rec.dcp_size, rec.confidence) == ("trtllm", 1, "prior")
    assert rec.mem_fraction_flag == "--kv_cache_free_gpu_memory_fraction"
    shape = w.model_shape()
    best = rec.predictions[0]
    used = used_before_kv("trtllm", w, shape, best.memory_flags)
    free = round(trtllm.free_fraction(rec.mem_fraction, w.gpu_spec().memory_bytes, used), 2)
    assert rec.mem_flag_value == free < rec.mem_fraction
    cmd = rec.launch_command
    assert cmd[:4] == ["trtllm-serve", "meta-llama/L-70B", "--tp_size", "8"]
    assert cmd[cmd.index("--kv_cache_free_gpu_memory_fraction") + 1] == f"{free:.2f}"
    assert cmd[-2:] == ["--config", CONFIG] and "--cp_size" not in cmd
    assert rec.config_file.path == CONFIG
    config = yaml.safe_load(rec.config_file.content)
    assert config["kv_cache_config"] == {"free_gpu_memory_fraction": free, "tokens_per_block": 32,
                                         "enable_block_reuse": True, "dtype": "fp8"}
    assert config["return_perf_metrics"] is True and "cp_config" not in config
    why = next(r for r in rec.reasons if "--kv_cache_free_gpu_memory_fraction" in r)
    assert f"memory fraction {rec.mem_fraction:.2f} of the GPU" in why
    assert f"= {free:.2f} of the" in why and "free after" in why


def test_vllm_and_sglang_recommendations_have_no_config_file():
    m = default_model()
    rec = recommend(m, llama(), m.version)
    assert rec.engine in ("vllm", "sglang")
    assert rec.config_file is None and rec.mem_flag_value == rec.mem_fraction
    assert not any("trtllm" in r or "TensorRT" in r for r in rec.reasons)


def test_a_workload_naming_no_engines_is_answered_as_before_without_trtllm():
    m = default_model()
    rec = recommend(m, kimi(), m.version)
    assert engines.defaults() == ("vllm", "sglang") and "trtllm" in engines.names()
    assert {p.engine for p in rec.predictions} == {"vllm", "sglang"}


# ------------------------------------------------------------------ Helix
def test_helix_is_the_dcp_of_mla_models_on_blackwell_and_says_it_is_experimental():
    m = default_model()
    rec = recommend(m, kimi(engines=["trtllm"], dcp_sizes=[8]), m.version)
    assert (rec.engine, rec.dcp_size) == ("trtllm", 8)
    cmd = rec.launch_command
    # world = tp x cp: 8 GPUs at CP 8
    assert cmd[2:6] == ["--tp_size", "1", "--cp_size", "8"]
    config = yaml.safe_load(rec.config_file.content)
    assert config["context_parallel_size"] == 8
    assert config["cp_config"] == {"cp_type": "HELIX", "tokens_per_block": 32}
    assert config["cp_config"]["tokens_per_block"] == config["kv_cache_config"][
        "tokens_per_block"]
    helix = next(r for r in rec.reasons if r.startswith("trtllm dcp > 1:"))
    assert "experimental" in helix and "disaggregated" in helix and "prior" in helix


def test_no_helix_on_hopper_or_for_gqa_models():
    m = default_model()
    rec = recommend(m, kimi(preset="deepseek-v2-lite", gpu="H200", engines=["trtllm"]),
                    m.version)
    assert {p.dcp_size for p in rec.predictions} == {1}
    assert {x.dcp_size for x in rec.excluded} == {2, 4, 8}
    assert all("blackwell GPUs only" in x.reason for x in rec.excluded)
    rec = recommend(m, llama(gpu="B300", engines=["trtllm"]), m.version)
    assert {p.dcp_size for p in rec.predictions} == {1}
    assert all("MLA attention only" in x.reason for x in rec.excluded)
    assert not any(r.startswith("trtllm dcp > 1") for r in rec.reasons)


# ------------------------------------------------------------------ capabilities
@pytest.mark.parametrize("req,why", [
    (Requirements(hardware_vendor="amd"), "does not run on amd"),
    (Requirements(quantization="gguf"), "quantization 'gguf'"),
    (Requirements(speculative_method="eagle3"), None),
    (Requirements(speculative_method="medusa"), None),
    (Requirements(quantization="nvfp4", lora=True, dp_attention=True), None),
])
def test_trtllm_capabilities(req, why):
    out = engine_exclusion("trtllm", req, kimi().model_shape())
    assert (out is None) if why is None else (why in out)


def test_a_requirement_trtllm_lacks_excludes_it_from_a_recommendation():
    m = default_model()
    w = llama(engines=["vllm", "trtllm"], requirements={"hardware_vendor": "amd"})
    rec = recommend(m, w, m.version)
    assert {p.engine for p in rec.predictions} == {"vllm"}
    assert [(x.engine, x.dcp_size) for x in rec.excluded if x.engine == "trtllm"] == [
        ("trtllm", None)]


def test_hybrid_state_is_costed_per_running_sequence():
    layout = engines.get("trtllm").state_layout
    from engine_advisor.model.engines.base import HybridShape
    h = HybridShape(n_full=4, n_linear=12, linear_kind="mamba2", attention="gqa",
                    attn_token_layer_bytes=1024.0, conv_elems=100.0, ssm_elems=1000.0,
                    ssm_dtype=None, ssm_cache_dtype="float32", gpu_family="hopper",
                    gpu_memory_gib=141.0, max_model_len=8192)
    x = layout(h)
    assert x.mode == 0 and x.default_running == 2048
    assert x.state_bytes == 12 * (100.0 * 2 + 1000.0 * 4)
    assert math.isclose(layout(h.__class__(**{**h.__dict__, "ssm_cache_dtype": "bfloat16"})
                               ).state_bytes, 12 * (100.0 * 2 + 1000.0 * 2))


def test_a_capacity_plan_on_trtllm_carries_its_flag_config_and_why():
    from engine_advisor.model.plan import PlanRequest, plan
    m = default_model()
    req = PlanRequest.model_validate({
        "classes": [{"context_tokens": 8192, "output_tokens": 512, "requests_per_second": 2}],
        "gpu": "H200", "gpus_per_node": 8, "preset": "llama-3.1-70b", "engines": ["trtllm"],
        "slo": {"max_tpot_s": 0.1}})
    (c,) = plan(m, req, m.version).classes
    assert c.engine == "trtllm" and c.calibrated is False
    assert c.mem_flag_value < c.mem_fraction
    cmd = c.launch_command
    assert cmd[0] == "trtllm-serve" and cmd[-2:] == ["--config", CONFIG]
    assert cmd[cmd.index("--max_batch_size") + 1] == str(c.concurrency)
    assert cmd[cmd.index("--kv_cache_free_gpu_memory_fraction") + 1] == (
        f"{c.mem_flag_value:.2f}")
    assert yaml.safe_load(c.config_file.content)["kv_cache_config"][
        "free_gpu_memory_fraction"] == c.mem_flag_value
    assert any(r.startswith("trtllm calibrated: false:") for r in c.reasons)
    assert any("of the GPU" in r and "free after" in r for r in c.reasons)


def test_the_note_goes_once_the_model_holds_trtllm_data():
    """A model fitted on the user's own trtllm rows (any GPU) no longer says none exist."""
    from types import SimpleNamespace

    from engine_advisor.model.predict.query import uncalibrated_notes
    none = uncalibrated_notes(SimpleNamespace(engine_names=["vllm"]), ("vllm", "trtllm"))
    assert none["vllm"] is None and "cannot be installed here" in none["trtllm"]
    some = uncalibrated_notes(SimpleNamespace(engine_names=["trtllm"]), ("vllm", "trtllm"))
    assert some == {"vllm": None, "trtllm": None}
