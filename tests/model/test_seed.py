"""The seed's workload is the rule's choice (engine_advisor.model.fit.seedcheck), and the seed's own
question has the same answer under every assumption consistent with the published times."""

import pytest
import seedload

from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.dataset import read_csv
from engine_advisor.model.fit.default import REFERENCE_CSV, real_rows
from engine_advisor.model.fit.seedcheck import Assumption, choose, scan, with_assumption
from engine_advisor.model.recommend import recommend


@pytest.fixture(scope="module")
def verdicts():
    return scan()


@pytest.mark.slow
def test_the_reference_data_states_the_rules_choice(verdicts):
    best = choose(verdicts)
    assert best is not None and best.consistent
    a = best.assumption
    assert (a.batch_size, a.output_tokens, a.prefix_share) == (
        seedload.BATCH, seedload.OUTPUT, seedload.SHARE)
    # the chosen one moved at most two numbers per engine, SGLang's only DCP and prefill terms
    engines = {k.split()[0] for k in best.freed}
    assert engines <= {"vllm", "sglang"}
    for e in engines:
        assert sum(k.startswith(e + " ") for k in best.freed) <= 2


@pytest.mark.slow
def test_the_seed_question_has_one_answer_under_every_consistent_assumption(verdicts):
    consistent = [v.assumption for v in verdicts if v.consistent]
    assert len(consistent) >= 2
    published = read_csv(REFERENCE_CSV)
    for a in consistent:
        m = CostModel.fit(with_assumption(published, a) + real_rows())
        w = dict(output_tokens=a.output_tokens, batch_size=a.batch_size,
                 requirements={"prefix_reuse_share": a.prefix_share})
        short = recommend(m, seedload.workload(65_536, **w), "t")
        long = recommend(m, seedload.workload(204_800, **w), "t")
        assert (short.engine, short.dcp_size) == ("vllm", 1), a
        assert (long.engine, long.dcp_size) == ("sglang", 8), a
        assert short.mem_fraction == long.mem_fraction == 0.92, a


def test_an_inconsistent_assumption_is_named_so():
    from engine_advisor.model.fit.seedcheck import judge

    v = judge(Assumption(512, 8192, "distinct"))      # the prefill alone beats the times
    assert not v.consistent


def test_the_seed_reproduces_kimi_k3_and_leaks_to_no_other_model():
    """Two points per engine hold nothing out: the B300 levels they fit apply to Kimi-K3 only.
    Another model on the same 8 x B300 gets the physics priors and says so (uncalibrated, not
    transferred): SGLang's DCP-8 merge cost of the seed (tens of times its prior) does not
    reach DeepSeek-V3, whose 61 MLA layers would otherwise pay it in every step."""
    from engine_advisor.model.fit.default import default_model
    from engine_advisor.model.fit.estimator import PRIOR
    from engine_advisor.model.physics.terms import TERMS
    from engine_advisor.model.predict.predictor import predictor_for
    from engine_advisor.model.workload import Workload

    m = default_model()
    seed_level = m.engines["sglang/B300"]
    assert not seed_level.transfers_ and len(seed_level.models_) == 1
    assert m.engines["sglang/H200"].transfers_
    k3 = Workload(context_tokens=131_072, output_tokens=1024, batch_size=8, preset="kimi-k3")
    v3 = k3.model_copy(update={"preset": "deepseek-v3"})
    pred = predictor_for(m)
    dcp_fixed = TERMS.index("dcp_fixed")
    assert pred.coefficients("sglang", "B300", k3.model_shape(), 8)[0][dcp_fixed] > \
        10 * PRIOR["dcp_fixed"]
    assert pred.coefficients("sglang", "B300", v3.model_shape(), 8)[0][dcp_fixed] == \
        PRIOR["dcp_fixed"]
    assert m.calibrated_range("sglang", "B300", 8, 8, k3.model_shape().key)[0] == "calibrated"
    assert m.calibrated_range("sglang", "B300", 8, 8, v3.model_shape().key)[0] == "uncalibrated"
    # on the physics, DCP 8 reads DeepSeek-V3's 128K contexts faster than DCP 1 (1 / 8 each)
    rec = recommend(m, v3.model_copy(update={"engines": ["sglang"],
                                             "allow_extrapolation": True}), "t")
    tpot = {p.dcp_size: p.tpot_s for p in rec.predictions}
    assert tpot[8] < tpot[1]
    assert not any(p.calibrated or p.transferred for p in rec.predictions)
