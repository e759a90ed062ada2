"""predict_grid (the batched path) predicts what the recommender's own pass predicts."""

import numpy as np

from model.fit.default import default_model
from model.predict.batch import predict_grid
from model.queries import evaluate
from model.workload import Config, Workload


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
