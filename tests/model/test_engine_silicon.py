"""An engine's own kernel tables (engine_advisor.model.hardware.silicon.Silicon.for_engine): a
profile in ``<profiles>/<engine>/`` is read first for that engine's predictions and never for
another engine's, on every path a prediction takes (a recommendation's query, the batch
predictor, the fit's features, the simulator's step timer)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.hardware.gpus import builtin_gpu
from engine_advisor.model.hardware.profiles import (
    DEFAULT_PROFILES_DIR,
    PROFILES_ENV,
    clear_profile_cache,
)
from engine_advisor.model.hardware.silicon import silicon_for
from engine_advisor.model.physics.features import Case, case_features
from engine_advisor.model.predict.predictor import predictor_for
from engine_advisor.model.predict.query import total_curves
from engine_advisor.model.queries import evaluate
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Config, Workload

H200 = builtin_gpu("H200")


def curve(bw: float) -> dict:
    return {"bytes": [1e6, 1e9], "seconds": [1e6 / bw, 1e9 / bw], "overhead_s": 1e-6,
            "asymptotic_Bps": bw, "n_points": 2}


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    """A profiles directory with a shared H200 profile (MLA reads at 2 TB/s) and one of
    TensorRT-LLM's own (8 TB/s)."""
    d = tmp_path / "profiles"
    (d / "trtllm").mkdir(parents=True)
    (d / "shared.json").write_text(json.dumps({
        "kind": "gpu-profile", "gpu_key": "H200", "source": {"engine": "sglang"},
        "attention": {"mla": {"bf16": curve(2e12)}}}))
    (d / "trtllm" / "h200.json").write_text(json.dumps({
        "kind": "gpu-profile", "gpu_key": "H200", "source": {"engine": "trtllm"},
        "attention": {"mla": {"bf16": curve(8e12)}}}))
    monkeypatch.setenv(PROFILES_ENV, str(d))
    clear_profile_cache()
    yield d
    clear_profile_cache()


def kimi(context: int = 131_072, batch: int = 8, **kw) -> Workload:
    return Workload(context_tokens=context, output_tokens=256, batch_size=batch, preset="kimi-k2",
                    gpu="H200", num_gpus=8, allow_extrapolation=True, **kw)


def test_an_engines_own_tables_are_read_first_and_only_for_it(profiles):
    si = silicon_for(H200)
    own = si.for_engine("trtllm")
    assert own is not si and own.engine == "trtllm"
    assert own.read_source("mla", "bf16") == "profile:trtllm/h200.json"
    assert own.asymptotic_read_Bps("mla", "bf16") == pytest.approx(8e12)
    for other in ("vllm", "sglang"):          # no tables of their own: the shared silicon
        assert si.for_engine(other) is si
    assert si.asymptotic_read_Bps("mla", "bf16") == pytest.approx(2e12)
    assert "trtllm/h200.json" in own.provenance and "trtllm" not in si.provenance
    assert si.for_engine("trtllm") is own      # built once per silicon
    # an engine subdirectory is looked up by the engine's name, never as a path
    assert si.for_engine("../trtllm") is si


def test_a_recommendation_predicts_each_engine_on_its_own_silicon(profiles):
    model = default_model()
    w = kimi(engines=["vllm", "sglang", "trtllm"])
    mixed = {(e.pred.engine, e.pred.dcp_size): e.pred for e in evaluate(model, w)}
    # TensorRT-LLM alone, and vLLM and SGLang alone, give the same predictions
    alone = {(e.pred.engine, e.pred.dcp_size): e.pred
             for names in (["trtllm"], ["vllm", "sglang"])
             for e in evaluate(model, w.model_copy(update={"engines": names}))}
    assert mixed.keys() == alone.keys()
    for key, p in mixed.items():
        assert p.total_s == pytest.approx(alone[key].total_s, rel=1e-12), key
        assert p.kv_read_source == alone[key].kv_read_source
    assert mixed[("trtllm", 1)].kv_read_source == "profile:trtllm/h200.json"
    assert mixed[("sglang", 1)].kv_read_source == "profile:shared.json"
    # the faster read shows in TensorRT-LLM's MLA read term, not in the others'
    trt, sgl = mixed[("trtllm", 1)].step_terms_s, mixed[("sglang", 1)].step_terms_s
    assert trt["mla_read"] < 0.5 * sgl["mla_read"]


def test_the_batch_path_and_the_fit_agree_with_the_query(profiles):
    model = default_model()
    w = kimi(8192, 1, engines=["vllm", "sglang", "trtllm"])     # the whole batch fits
    configs = [Config(engine=e, dcp_size=1) for e in ("sglang", "trtllm", "vllm")]
    query = {e.pred.engine: e.pred.total_s for e in evaluate(model, w, configs)}
    curves = total_curves(model, w, w.model_shape(), configs, np.array([8192.0]))
    for c, row in zip(configs, curves, strict=True):
        assert row[0] == pytest.approx(query[c.engine], rel=1e-9), c.engine
    # the fit's features of a row follow its engine's silicon too
    shape, si = w.model_shape(), silicon_for(H200)
    one = lambda e: Case(shape, si, 8, np.array([e]), [8.0], [131_072.0], [256.0],  # noqa: E731
                         [1.0], [0.9])
    both = case_features(Case(shape, si, 8, np.array(["sglang", "trtllm"]), [8.0, 8.0],
                              [131_072.0] * 2, [256.0] * 2, [1.0, 1.0], [0.9, 0.9]))
    for i, e in enumerate(("sglang", "trtllm")):
        assert np.allclose(both.X[i], case_features(one(e)).X[0])
    assert not np.allclose(both.X[0], both.X[1])
    table = predictor_for(model).table(Case(shape, si, 8, np.array(["trtllm", "sglang"]),
                                            [8.0, 8.0], [131_072.0] * 2, [256.0] * 2,
                                            [1.0, 1.0], [0.9, 0.9]))
    assert table.shape[0] == 2


def test_the_recommendations_reason_names_the_profiles_its_engine_ran_on(profiles):
    rec = recommend(default_model(), kimi(8192, 1, engines=["trtllm"]), "v")
    assert any("trtllm/h200.json" in r for r in rec.reasons)


def test_shipped_trtllm_tables_read_fp8_mla_on_hopper_at_their_own_rate(monkeypatch):
    """The shipped profiles (calibration/profiles/trtllm/): TensorRT-LLM's fp8 MLA decode on
    H200 reads at about 3 TB/s, where the shared profile (SGLang 0.5.14's kernel) reads fp8
    latents at 0.3; bf16 reads agree within 10 %."""
    monkeypatch.delenv(PROFILES_ENV, raising=False)
    clear_profile_cache()
    si = silicon_for(H200)
    trt = si.for_engine("trtllm")
    assert trt.read_source("mla", "fp8") == "profile:trtllm/h200.json"
    assert 2.5e12 < trt.asymptotic_read_Bps("mla", "fp8") < 3.5e12
    assert si.asymptotic_read_Bps("mla", "fp8") < 0.5e12
    big = np.array([1e8])
    ratio = trt.attn_read_s("mla", "bf16", big)[0] / si.attn_read_s("mla", "bf16", big)[0]
    assert 0.9 < ratio < 1.1
    for gpu in ("H100", "H200", "B200", "B300", "GB200", "GB300"):
        prof = json.loads((DEFAULT_PROFILES_DIR / "trtllm" / f"{gpu.lower()}.json").read_text())
        assert prof["source"]["engine"] == "trtllm" and prof["gpu_key"] == gpu
        assert silicon_for(builtin_gpu(gpu)).for_engine("trtllm").engine == "trtllm"


def test_an_engines_own_moe_floor_replaces_the_constant_and_only_for_it(tmp_path, monkeypatch):
    """``moe_call`` in an engine's own profile is its fused-MoE floor per experts' format
    (clamped to the measured expert counts); the same section in a shared profile is not read:
    vLLM's and SGLang's floors are the constant their fitted moe_fixed scales."""
    from engine_advisor.model.hardware.silicon import MOE_CALL_S
    d = tmp_path / "profiles"
    (d / "trtllm").mkdir(parents=True)
    moe = {"fp8_block": {"base_s": 20e-6, "per_expert_s": 0.25e-6, "experts_range": [8, 512],
                         "n_shapes": 17, "median_rel_error": 0.03}}
    for path in (d / "shared.json", d / "trtllm" / "h200.json"):
        path.write_text(json.dumps({"kind": "gpu-profile", "gpu_key": "H200",
                                    "attention": {"mla": {"bf16": curve(3e12)}},
                                    "moe_call": moe}))
    monkeypatch.setenv(PROFILES_ENV, str(d))
    clear_profile_cache()
    try:
        si = silicon_for(H200)
        trt = si.for_engine("trtllm")
        assert trt.moe_call_s("fp8 block 128x128", 256) == pytest.approx(84e-6)
        assert trt.moe_call_s("fp8 block 128x128", 4096) == pytest.approx(148e-6)  # clamped
        assert trt.moe_call_s("bf16", 128) == MOE_CALL_S["hopper"]   # no fit for the format
        assert trt.moe_call_s("mxfp4 g32", 896) == MOE_CALL_S["hopper"]
        assert si.moe_call_s("fp8 block 128x128", 256) == MOE_CALL_S["hopper"]
        assert trt.sources["moe_call"] == "profile:trtllm/h200.json"
    finally:
        clear_profile_cache()
