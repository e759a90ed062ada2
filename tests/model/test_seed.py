"""The seed's workload is the rule's choice (model.fit.seedcheck), and the seed's own question has
the same answer under every assumption consistent with the published times."""

import pytest
import seedload

from model.fit.costmodel import CostModel
from model.fit.dataset import read_csv
from model.fit.default import REFERENCE_CSV, real_rows
from model.fit.seedcheck import Assumption, choose, scan, with_assumption
from model.recommend import recommend


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
    from model.fit.seedcheck import judge

    v = judge(Assumption(512, 8192, "distinct"))      # the prefill alone beats the times
    assert not v.consistent
