"""Engine capabilities: data file, exclusions for requirements, prefix-reuse prefill factor."""

from __future__ import annotations

import numpy as np
import pytest

from engine_advisor.model import engines
from engine_advisor.model.engines import effective_share
from engine_advisor.model.errors import NoEligibleConfiguration
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.physics.shape import bare
from engine_advisor.model.predict.capabilities import (
    engine_exclusion,
    exclusions,
    load_capabilities,
)
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Requirements, Workload

MLA = bare(70272, attention="mla")
GQA = bare(262144, attention="gqa", kv_heads=8)
SEED = dict(context_tokens=204_800, output_tokens=2048, batch_size=64, kv_bytes_per_token=70272)


def test_data_file_names_its_source_and_each_engine_its_capabilities():
    caps = load_capabilities()
    assert "official documentation" in caps.source
    assert set(engines.names()) == {"vllm", "sglang", "trtllm"}
    for name in engines.names():
        assert engines.get(name).capabilities.prefix_reuse.block_tokens >= 1
    # the radix tree is token-granular, vLLM's prefix cache blocks of 16, TensorRT-LLM's of 32
    assert (engines.get("sglang").capabilities.prefix_reuse.block_tokens
            < engines.get("vllm").capabilities.prefix_reuse.block_tokens
            < engines.get("trtllm").capabilities.prefix_reuse.block_tokens == 32)


def test_no_requirements_excludes_nothing():
    assert exclusions(None, MLA) == {}
    assert exclusions(Requirements(), MLA) == {}


@pytest.mark.parametrize("req, excluded", [
    (Requirements(hardware_vendor="tpu"), {"sglang", "trtllm"}),
    (Requirements(hardware_vendor="cpu"), {"sglang", "trtllm"}),
    (Requirements(hardware_vendor="ascend"), {"vllm", "trtllm"}),
    (Requirements(hardware_vendor="intel"), {"vllm", "sglang", "trtllm"}),
    (Requirements(hardware_vendor="nvidia"), set()),
    (Requirements(quantization="GGUF"), {"sglang", "trtllm"}),
    (Requirements(quantization="blockwise-int8"), {"vllm", "trtllm"}),
    (Requirements(quantization="auto-round"), {"vllm", "trtllm"}),
    (Requirements(quantization="fp8"), set()),
    (Requirements(quantization="modelopt_fp4"), {"sglang"}),
    # Marlin is a kernel of vLLM and SGLang; TensorRT-LLM runs GPTQ checkpoints its own way
    (Requirements(quantization="gptq-marlin"), {"trtllm"}),
    (Requirements(quantization="gptq"), set()),
    (Requirements(quantization="no-such-format"), {"vllm", "sglang", "trtllm"}),
    (Requirements(speculative_method="n-gram"), {"sglang"}),
    (Requirements(speculative_method="medusa"), {"vllm", "sglang"}),
    (Requirements(speculative_method="lookahead"), {"vllm", "sglang"}),
    (Requirements(speculative_method="EAGLE-3"), {"vllm"}),
    (Requirements(speculative_method="mtp"), set()),
    (Requirements(pipeline_parallel=True), set()),
    (Requirements(pipeline_parallel=True, speculative_method="eagle"), {"vllm"}),
    (Requirements(lora=True), set()),
    (Requirements(dp_attention=True), {"vllm"}),
])
def test_exclusions_follow_the_capability_table(req, excluded):
    out = exclusions(req, MLA)
    assert set(out) == excluded
    for reason in out.values():
        assert reason


def test_pp_with_speculative_reason_names_the_version():
    reason = engine_exclusion("vllm", Requirements(pipeline_parallel=True,
                                                   speculative_method="mtp"), MLA)
    assert "pipeline" in reason and "0.15.0" in reason


def test_dp_attention_needs_an_mla_model():
    assert "MLA" in exclusions(Requirements(dp_attention=True), GQA)["sglang"]
    assert "sglang" not in exclusions(Requirements(dp_attention=True), MLA)


def test_recommend_lists_capability_exclusions():
    m = default_model()
    w = Workload.model_validate({**SEED, "requirements": {"pipeline_parallel": True,
                                                          "speculative_method": "eagle"}})
    rec = recommend(m, w, m.version)
    assert rec.engine == "sglang"
    assert {p.engine for p in rec.predictions} == {"sglang"}
    assert [(e.engine, e.dcp_size) for e in rec.excluded] == [("vllm", None)]
    assert "speculative" in rec.excluded[0].reason


def test_recommend_with_everything_excluded_says_why():
    m = default_model()
    w = Workload.model_validate({**SEED, "requirements": {"hardware_vendor": "intel"}})
    with pytest.raises(NoEligibleConfiguration, match="every configuration is excluded.*intel"):
        recommend(m, w, m.version)


def test_effective_share_counts_whole_cache_blocks():
    # 1,000 of 2,000 tokens reusable: vLLM finds 62 blocks of 16 (992 tokens), SGLang all 1,000
    assert effective_share("vllm", 0.5, 2000) == pytest.approx(992 / 2000)
    assert effective_share("sglang", 0.5, 2000) == pytest.approx(0.5)
    assert effective_share("vllm", 0.0, 2000) == 0.0


def test_prefix_reuse_lowers_prefill_not_the_decode_of_a_batch_that_fits():
    m = default_model()
    small = {**SEED, "batch_size": 4, "context_tokens": 32768}
    base = recommend(m, Workload.model_validate(small), m.version)
    reuse = recommend(m, Workload.model_validate(
        {**small, "requirements": {"prefix_reuse_share": 0.6}}), m.version)
    before = {(p.engine, p.dcp_size): p for p in base.predictions}
    for p in reuse.predictions:
        b = before[(p.engine, p.dcp_size)]
        assert p.running_sequences == b.running_sequences == 4
        assert p.prefill_s < b.prefill_s
        assert p.total_s == pytest.approx(b.total_s - (b.prefill_s - p.prefill_s))
        assert p.decode_s == pytest.approx(b.decode_s)


def test_prefix_reuse_lets_more_sequences_share_the_kv_cache():
    m = default_model()
    w = Workload.model_validate({**SEED, "engines": ["vllm"], "dcp_sizes": [1]})
    shared = Workload.model_validate({**SEED, "engines": ["vllm"], "dcp_sizes": [1],
                                      "requirements": {"prefix_reuse_share": 0.9}})
    a = recommend(m, w, m.version).predictions[0]
    b = recommend(m, shared, m.version).predictions[0]
    assert a.running_sequences < b.running_sequences
    assert b.total_s < a.total_s


def test_prefix_reuse_also_moves_the_crossover_curves():
    # The crossover is computed from the same (prefix-reused) predictions as the table.
    m = default_model()
    kimi = {**SEED, "kv_bytes_per_token": None, "preset": "kimi-k3"}
    kimi = {k: v for k, v in kimi.items() if v is not None}
    w = Workload.model_validate({**kimi, "requirements": {"prefix_reuse_share": 0.9}})
    from engine_advisor.model.decision.crossover import CROSSOVER_GRID, crossover_near
    from engine_advisor.model.predict.query import total_curves
    from engine_advisor.model.queries import query_for
    from engine_advisor.model.workload import Config
    cfgs = [Config("vllm", 1), Config("sglang", 8)]
    curves = total_curves(m, w, w.model_shape(), cfgs, CROSSOVER_GRID)
    plain = Workload.model_validate(kimi)
    before = total_curves(m, plain, plain.model_shape(), cfgs, CROSSOVER_GRID)
    both = np.isfinite(curves) & np.isfinite(before)    # NaN: not even one sequence fits
    assert both.sum() > 100 and (curves[both] < before[both]).all()
    assert np.isfinite(curves).sum() >= np.isfinite(before).sum()   # sharing frees KV
    rec = recommend(m, w, m.version)
    assert rec.crossover_context_tokens == crossover_near(query_for(m, w), w, cfgs)
