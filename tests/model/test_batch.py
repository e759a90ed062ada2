"""predict_grid (the batched path) predicts what the recommender's own pass predicts."""

import numpy as np

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.predict.batch import predict_grid
from engine_advisor.model.queries import evaluate
from engine_advisor.model.workload import Config, Workload


def test_grid_matches_the_recommender_row_by_row():
    m = default_model()
    workloads = [Workload(context_tokens=ctx, output_tokens=out, batch_size=b, gpu=gpu,
                          kv_bytes_per_token=70272, allow_extrapolation=True)
                 for ctx, out, b, gpu in [(4096, 128, 1, "B300"), (204_800, 2048, 64, "H200"),
                                          (65_536, 512, 8, "B300")]]
    configs = [Config("vllm", 1), Config("sglang", 8), Config("vllm", 4)]
    grid = predict_grid(m, workloads, configs)
    assert grid.total.shape == (len(workloads) * len(configs),)
    for i, w in enumerate(workloads):
        want = [e.pred for e in evaluate(m, w, configs)]
        got = slice(i * len(configs), (i + 1) * len(configs))
        np.testing.assert_allclose(grid.total[got], [p.total_s for p in want], rtol=1e-12)
        np.testing.assert_allclose(grid.tpot[got], [p.tpot_s for p in want], rtol=1e-12)
    # different workloads and GPUs give different predictions (rows are not shared)
    assert len(np.unique(np.round(grid.total, 9))) == len(grid.total)


def test_a_query_reports_what_the_batch_path_predicts():
    """``Query.evaluate`` (one compiled call: sizes, coverage and reported figures in the
    kernel, the decode terms unpacked by name) against ``Predictor.predict`` over the same
    rows: every figure and every decode term, in ``DECODE_TERMS``' order, for calibrated,
    uncalibrated, prefix-shared, queued and extrapolated configurations."""
    from engine_advisor.model.fit.costmodel import EXTRAPOLATION_REL_SIGMA
    from engine_advisor.model.formulas.layout import DECODE_TERMS
    from engine_advisor.model.predict.predictor import predictor_for
    from engine_advisor.model.predict.query import build_case
    from engine_advisor.model.queries import query_for

    m = default_model()
    specs = [dict(context_tokens=200_000, output_tokens=2048, batch_size=64, preset="kimi-k3"),
             dict(context_tokens=3000, output_tokens=100, batch_size=3, preset="kimi-k3"),
             dict(context_tokens=32_768, output_tokens=512, batch_size=600, gpu="H200",
                  num_gpus=8, preset="llama-3.1-70b",
                  requirements={"prefix_reuse_share": 0.4}, allow_extrapolation=True),
             dict(context_tokens=8192, output_tokens=256, batch_size=4, gpu="H200",
                  num_gpus=1, kv_bytes_per_token=70_272)]
    seen = dict.fromkeys(("outside", "queued", "calibrated", "uncalibrated"), False)
    for spec in specs:
        w = Workload.model_validate(spec)
        q = query_for(m, w)
        got = q.evaluate(w)
        extra = np.array([q.sigma[i] + (EXTRAPOLATION_REL_SIGMA * _doublings(q, i, w))
                          for i in range(len(got))])
        want = predictor_for(m).predict(build_case(m, w, q.shape, list(q.configs)), extra)
        seen["outside"] |= bool(extra.max() > q.sigma.max())
        for i, e in enumerate(got):
            p = e.pred
            assert tuple(p.step_terms_s) == DECODE_TERMS
            np.testing.assert_allclose(list(p.step_terms_s.values()), want.step_parts[i],
                                       rtol=1e-12, atol=1e-15)
            np.testing.assert_allclose(
                [p.total_s, p.interval_s[0], p.interval_s[1], p.prefill_s, p.tpot_s],
                [want.total[i], want.total_lo[i], want.total_hi[i], want.prefill_all[i],
                 want.tpot[i]], rtol=1e-12)
            assert p.decode_s == max(p.total_s - p.prefill_s, 0.0)
            assert p.running_sequences == (int(want.running[i]) if want.feasible[i] else 0)
            assert p.kv_capacity_tokens == min(int(want.capacity[i]), 2 ** 62)
            seen["queued"] |= 0 < p.running_sequences < w.batch_size
            seen["calibrated"] |= p.calibrated
            seen["uncalibrated"] |= not (p.calibrated or p.transferred)
    assert all(seen.values()), seen


def _doublings(q, i: int, w: Workload) -> float:
    from engine_advisor.model.predict.query import doublings_outside
    rng = q.facts.per_config[i][5]
    return doublings_outside(rng, {"context_tokens": w.context_tokens,
                                   "batch_size": w.batch_size,
                                   "output_tokens": w.output_tokens}) if rng else 0.0
