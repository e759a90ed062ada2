"""An answer for every GPU (issue 31): the physics prior answers where nothing is calibrated,
allow_extrapolation matters only beside calibrated configurations, and "does not fit" names
its cause with numbers and suggestions that are checked to hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine_advisor.model import engines
from engine_advisor.model.errors import NoEligibleConfiguration
from engine_advisor.model.fit.costmodel import UNCALIBRATED_REL_SIGMA
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.hardware.gpus import builtin_gpu
from engine_advisor.model.physics.capacity import instance_pool
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload

QWEN = json.loads((Path(__file__).parents[1] / "data" / "qwen2.5-72b-config.json").read_text())
Z90 = 1.645


def rec(**kw):
    m = default_model()
    return recommend(m, Workload(**kw), m.version)


def refusal(**kw) -> NoEligibleConfiguration:
    with pytest.raises(NoEligibleConfiguration) as exc:
        rec(**kw)
    return exc.value


QWEN_H100 = dict(hf_config=QWEN, model="Qwen/Qwen2.5-72B", gpu="H100", num_gpus=8,
                 context_tokens=32_768, output_tokens=512, batch_size=8)


def test_qwen_config_on_8_h100_is_answered_from_the_prior():
    r = rec(**QWEN_H100)
    assert r.confidence == "prior"
    assert r.predictions and not any(p.calibrated or p.transferred for p in r.predictions)
    best = r.predictions[0]
    assert (r.engine, r.dcp_size) == (best.engine, best.dcp_size)
    # widened: the 90 % interval is at least the uncalibrated term's +-1.645 sd wide
    for p in r.predictions:
        lo, hi = p.interval_s
        assert (hi - lo) / p.total_s >= 2 * Z90 * UNCALIBRATED_REL_SIGMA * 0.999
    text = "\n".join(r.reasons)
    assert "answered from the physics prior: no configuration is calibrated on H100 x 8" in text
    rival = next(p for p in r.predictions if p.engine != r.engine)
    assert (f"calibrate {r.engine} dcp {r.dcp_size} and {rival.engine} dcp {rival.dcp_size} "
            "on H100 x 8 near 32,768 context tokens") in text
    assert "allow_extrapolation" not in text
    assert r.launch_command[:3] == (["vllm", "serve", "Qwen/Qwen2.5-72B"] if r.engine == "vllm"
                                    else ["python", "-m", "sglang.launch_server"])


def test_allow_extrapolation_changes_nothing_where_nothing_is_calibrated():
    a = rec(**QWEN_H100)
    b = rec(**QWEN_H100, allow_extrapolation=True)
    assert a.model_dump() == b.model_dump()


def test_allow_extrapolation_still_guards_calibrated_hardware():
    """8 x B300 has calibrated configurations: an uncalibrated faster one is listed and named,
    chosen only with allow_extrapolation, and the answer is not the prior's. (vLLM dcp 8,
    never measured there, holds eight times the KV of the measured dcp 1: at 64 sequences of
    204,800 tokens it runs them in far fewer waves.)"""
    kw = dict(preset="kimi-k3", gpu="B300", num_gpus=8, context_tokens=204_800,
              output_tokens=2048, batch_size=64, engines=["vllm"], dcp_sizes=[1, 8])
    guarded, free = rec(**kw), rec(**kw, allow_extrapolation=True)
    fastest = guarded.predictions[0]
    assert not fastest.calibrated
    assert (guarded.engine, guarded.dcp_size) != (fastest.engine, fastest.dcp_size)
    assert (free.engine, free.dcp_size) == (fastest.engine, fastest.dcp_size)
    assert guarded.confidence != "prior" and free.confidence == "low"


def test_deepseek_v3_on_8_h100_names_the_weights_and_what_would_fit():
    kw = dict(preset="deepseek-v3", gpu="H100", num_gpus=8, context_tokens=1024,
              output_tokens=128)
    exc = refusal(**kw)
    assert exc.field == "num_gpus"
    msg = str(exc)
    shape = Workload(**kw).model_shape()
    per_gpu = shape.weight_bytes / 8 / 1e9
    assert msg.startswith("the model does not fit on H100 x 8: its weights take "
                          f"{per_gpu:.1f} GB per GPU ({shape.weight_bytes / 1e9:.1f} GB over 8 "
                          "GPUs)")
    for engine in ("vllm", "sglang"):
        assert engines.get(engine).mem_flag + " 0.90 x 85.9 GB" in msg
    assert "allow_extrapolation" not in msg and "context_tokens" not in msg
    # each suggestion holds: more GPUs, and a 4-bit checkpoint of the same parameters
    gpus = int(re.search(r"num_gpus (\d+)", msg).group(1))
    assert rec(**{**kw, "num_gpus": gpus}).fits_in_memory
    with pytest.raises(NoEligibleConfiguration):
        rec(**{**kw, "num_gpus": gpus // 2})
    four_bit = shape.summary["total_params"] * 0.5
    assert f"4-bit (MXFP4, NVFP4, AWQ or GPTQ) checkpoint (about {four_bit / 1e9:.0f} GB" in msg
    assert rec(**kw, model_weight_bytes=four_bit).fits_in_memory
    # the same refusal with the flag set: it is never suggested
    again = refusal(**kw, allow_extrapolation=True)
    assert str(again) == msg and again.field == "num_gpus"


def test_one_sequence_too_long_blames_the_context_and_its_limit_holds():
    kw = dict(preset="llama-3.1-70b", gpu="H100", num_gpus=2, context_tokens=1_000_000,
              output_tokens=128)
    exc = refusal(**kw)
    assert exc.field == "context_tokens"
    msg = str(exc)
    assert "one sequence of 1,000,128 tokens (1,000,000 + 128) needs" in msg
    limit = int(re.search(r"a sequence of at most ([\d,]+) tokens", msg).group(1)
                .replace(",", ""))
    assert rec(**{**kw, "context_tokens": limit - 128}).predictions
    with pytest.raises(NoEligibleConfiguration):
        rec(**{**kw, "context_tokens": limit - 127})
    gpus = int(re.search(r"num_gpus (\d+)", msg).group(1))
    assert rec(**{**kw, "num_gpus": gpus}).predictions


def test_fp8_kv_is_suggested_only_when_not_already_set():
    kw = dict(preset="llama-3.1-8b", gpu="H100", num_gpus=1, output_tokens=128)
    msg = str(refusal(**kw, context_tokens=600_000))
    assert "kv_cache_dtype fp8" in msg
    assert rec(**kw, context_tokens=600_000, kv_cache_dtype="fp8").predictions
    msg8 = str(refusal(**kw, context_tokens=1_500_000, kv_cache_dtype="fp8"))
    assert "kv_cache_dtype fp8" not in msg8 and "at most" in msg8


def test_a_higher_memory_fraction_is_suggested_when_it_would_hold_the_model():
    """Weights just above 0.90 of an H100 (80 GiB) but below 0.94 of it."""
    kw = dict(kv_bytes_per_token=1024, model_weight_bytes=79e9, gpu="H100", num_gpus=1,
              context_tokens=4096, output_tokens=128)
    exc = refusal(**kw)
    assert exc.field == "num_gpus"
    found = re.search(r"(vllm|sglang) at (--[a-z-]+) (0\.\d\d) instead of the chosen (0\.\d\d)",
                      str(exc))
    assert found, str(exc)
    engine, flag, higher, chosen = found.groups()
    assert flag == engines.get(engine).mem_flag and float(higher) > float(chosen)
    shape = Workload(**kw).model_shape()
    gpu = builtin_gpu("H100")
    need = 4096 + 128

    def cap(f: float) -> int:
        return instance_pool(engine, f, gpu, shape, 1, 1).capacity_tokens

    assert cap(float(higher)) >= need
    assert cap(float(higher) - 0.01) < need
    assert cap(float(chosen)) < need


def test_excluded_configurations_say_why_they_hold_nothing():
    r = rec(preset="deepseek-v3", gpu="H200", num_gpus=8, context_tokens=1_000_000,
            output_tokens=128)
    assert r.confidence == "prior"
    held = {(p.engine, p.dcp_size) for p in r.predictions if p.running_sequences}
    out = [x for x in r.excluded if (x.engine, x.dcp_size) not in held]
    assert out and all("not even one sequence of 1,000,128 tokens" in x.reason for x in out)


def test_the_prior_answers_when_the_calibrated_configurations_hold_no_sequence():
    """vLLM on 8 x B300 is calibrated at dcp 1 only, which cannot hold one sequence of 3M
    tokens (its pool: 3,133 pages of 736 tokens); dcp 8 (not calibrated) can: the prior
    answers, saying why."""
    r = rec(preset="kimi-k3", gpu="B300", num_gpus=8, context_tokens=3_000_000,
            output_tokens=128, engines=["vllm"], dcp_sizes=[1, 8])
    assert (r.engine, r.dcp_size, r.confidence) == ("vllm", 8, "prior")
    assert any(x.startswith("answered from the physics prior: the configurations calibrated "
                            "on B300 x 8 hold no sequence of this workload") for x in r.reasons)
    (out,) = [x for x in r.excluded if (x.engine, x.dcp_size) == ("vllm", 1)]
    assert "not even one sequence of 3,000,128 tokens" in out.reason
