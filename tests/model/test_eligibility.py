"""Each prediction of a recommendation says whether the decision could choose it
(``eligible``, ``ineligible_reason``) as the decision does (``Evaluated.eligible``), and the
recommendation names the configuration its speed-up is over (``speedup_over``): over many
models, GPUs and sizes, with and without allow_extrapolation, the compared configuration is
eligible and every configuration faster than the chosen one is not, with a reason."""

from __future__ import annotations

import numpy as np
import pytest

from engine_advisor.model.decision.choose import decide
from engine_advisor.model.errors import NoEligibleConfiguration
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.presentation.answer import answer
from engine_advisor.model.queries import query_for
from engine_advisor.model.workload import Workload

PRESETS = ["kimi-k3", "llama-3.1-8b", "deepseek-v3", "qwen3-32b", "llama-3.1-70b"]
GPUS = ["B300", "H200", "H100", "B200", "GB300"]


def workloads(n: int):
    rng = np.random.default_rng(7)
    for i in range(n):
        yield Workload(context_tokens=int(rng.integers(1, 3_000_000)),
                       output_tokens=int(rng.integers(1, 20_000)),
                       batch_size=int(rng.integers(1, 512)), preset=PRESETS[i % 5],
                       gpu=GPUS[i // 5 % 5], num_gpus=[1, 2, 4, 8][i // 25 % 4],
                       allow_extrapolation=bool(i % 3 == 0))


def test_eligibility_and_the_speedup_baseline():
    m = default_model()
    seen = {"compared": 0, "faster ineligible": 0, "holds none": 0, "uncalibrated": 0}
    for w in workloads(400):
        q = query_for(m, w)
        evals = q.evaluate(w)
        try:
            d = decide(q, w, evals)
        except NoEligibleConfiguration:
            assert not any(e.pred.eligible for e in evals)
            continue
        rec = answer(w, q.shape, q.gpu, d, q.memory[d.best.config.engine],
                     q.provenance[d.best.config.engine], "v", q.moe_notes)
        for e in evals:
            p = e.pred
            assert p.eligible == e.eligible == (p.ineligible_reason is None), p
            if p.running_sequences == 0:
                seen["holds none"] += 1
                assert p.ineligible_reason.startswith(("not even one sequence", "its weights"))
            elif not p.eligible:
                seen["uncalibrated"] += 1
                assert not (w.allow_extrapolation or p.calibrated or p.transferred)
                assert p.ineligible_reason == (f"not calibrated on {q.gpu} x {w.num_gpus} "
                                               "(allow_extrapolation to consider it)")
        best = d.best.pred
        assert best.eligible and (best.engine, best.dcp_size) == (rec.engine, rec.dcp_size)
        for p in rec.predictions:
            if p.total_s < best.total_s:
                seen["faster ineligible"] += 1
                assert not p.eligible and p.ineligible_reason, p
        if rec.speedup is None:
            assert rec.speedup_over is None
            assert [p for p in rec.predictions if p.eligible] == [best]
            continue
        seen["compared"] += 1
        over = next(p for p in rec.predictions if (p.engine, p.dcp_size)
                    == (rec.speedup_over.engine, rec.speedup_over.dcp_size))
        assert over.eligible and over is not best
        assert over.total_s / best.total_s == pytest.approx(rec.speedup, rel=1e-12)
    assert all(seen.values()), seen        # every kind of case was met
