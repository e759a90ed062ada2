"""Engine capabilities: data file, exclusions for requirements, prefix-reuse prefill factor."""

from __future__ import annotations

import pytest

from model.capabilities import engine_exclusion, exclusions, load_capabilities, prefill_factors
from model.default import default_model
from model.kv import KvLayout
from model.recommend import NoEligibleConfiguration, recommend
from model.workload import Requirements, Workload

MLA = KvLayout(70272, "mla")
GQA = KvLayout(262144, "gqa", 8)
SEED = dict(context_tokens=204_800, output_tokens=2048, batch_size=64, kv_bytes_per_token=70272)


def test_data_file_names_its_source_and_both_engines():
    caps = load_capabilities()
    assert "004_" in caps.source
    assert set(caps.engines) == {"vllm", "sglang"}
    for c in caps.engines.values():
        assert 0 < c.prefix_reuse.effectiveness <= 1
    # the radix tree is token-granular, vLLM's prefix cache block-granular
    assert (caps.engines["sglang"].prefix_reuse.effectiveness
            > caps.engines["vllm"].prefix_reuse.effectiveness)


def test_no_requirements_excludes_nothing():
    assert exclusions(None, MLA) == {}
    assert exclusions(Requirements(), MLA) == {}


@pytest.mark.parametrize("req, excluded", [
    (Requirements(hardware_vendor="tpu"), {"sglang"}),
    (Requirements(hardware_vendor="cpu"), {"sglang"}),
    (Requirements(hardware_vendor="ascend"), {"vllm"}),
    (Requirements(hardware_vendor="intel"), {"vllm", "sglang"}),
    (Requirements(quantization="GGUF"), {"sglang"}),
    (Requirements(quantization="blockwise-int8"), {"vllm"}),
    (Requirements(quantization="auto-round"), {"vllm"}),
    (Requirements(quantization="fp8"), set()),
    (Requirements(quantization="gptq-marlin"), set()),
    (Requirements(quantization="no-such-format"), {"vllm", "sglang"}),
    (Requirements(speculative_method="n-gram"), {"sglang"}),
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


def test_prefill_factors():
    f = prefill_factors(["vllm", "sglang"], 0.5)
    caps = load_capabilities()
    assert f[0] == pytest.approx(1 - 0.5 * caps.engines["vllm"].prefix_reuse.effectiveness)
    assert f[1] == pytest.approx(1 - 0.5 * caps.engines["sglang"].prefix_reuse.effectiveness)
    assert list(prefill_factors(["vllm"], 0.0)) == [1.0]


def test_prefix_reuse_lowers_prefill_and_total_by_the_same_amount():
    m = default_model()
    base = recommend(m, Workload.model_validate(SEED), m.version)
    share = 0.6
    reuse = recommend(m, Workload.model_validate(
        {**SEED, "requirements": {"prefix_reuse_share": share}}), m.version)
    before = {(p.engine, p.dcp_size): p for p in base.predictions}
    caps = load_capabilities()
    for p in reuse.predictions:
        b = before[(p.engine, p.dcp_size)]
        eff = caps.engines[p.engine].prefix_reuse.effectiveness
        assert p.prefill_s == pytest.approx(b.prefill_s * (1 - share * eff))
        saved = b.prefill_s - p.prefill_s
        assert saved > 0
        assert p.total_s == pytest.approx(b.total_s - saved)
        assert p.decode_s == pytest.approx(b.decode_s)
        assert p.interval_s[0] <= p.total_s <= p.interval_s[1] < b.interval_s[1]


def test_prefix_reuse_also_moves_the_crossover_curves():
    # The crossover is computed from the same (prefix-reused) predictions as the table.
    m = default_model()
    w = Workload.model_validate({**SEED, "requirements": {"prefix_reuse_share": 0.9}})
    from model.recommend import CROSSOVER_GRID, crossover_near, total_curves
    from model.workload import Config
    cfgs = [Config("vllm", 1), Config("sglang", 8)]
    curves = total_curves(m, w, w.kv_layout(), cfgs, CROSSOVER_GRID)
    plain = Workload.model_validate(SEED)
    assert (curves < total_curves(m, plain, plain.kv_layout(), cfgs, CROSSOVER_GRID)).all()
    rec = recommend(m, w, m.version)
    assert rec.crossover_context_tokens == crossover_near(m, w, w.kv_layout(), cfgs)
