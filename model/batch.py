"""Vectorised predictions for many workloads x configurations at once (capacity sweeps, bench)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.costmodel import CostModel, Prediction, Query, dcp_combine_features, kv_read_seconds
from model.hardware import kv_read_model
from model.workload import Config, Workload


def predict_grid(model: CostModel, workloads: Sequence[Workload],
                 configs: Sequence[Config]) -> Prediction:
    """Predictions for every (workload, config) pair, workload-major: row i*len(configs)+j.

    No coverage widening or feasibility checks: callers that need those use ``recommend``.
    """
    n, m = len(workloads), len(configs)
    names = model.engine_names
    cols = np.empty((6, n))
    reads = {}
    for i, w in enumerate(workloads):
        layout = w.kv_layout()
        cols[:, i] = (w.context_tokens, w.output_tokens, w.batch_size,
                      layout.bytes_per_token / layout.shards(w.num_gpus), w.num_gpus, i)
        gpu = w.gpu_spec()
        group = reads.get(gpu.name)
        if group is None:  # the KV-read model once per GPU type, not per workload
            group = reads[gpu.name] = (kv_read_model(gpu), [], gpu)
        group[1].append(i)
    ctx, out, batch, kv = (np.repeat(c, m) for c in cols[:4])
    dcp = np.tile(np.array([float(c.dcp_size) for c in configs]), n)
    engine = np.tile(np.array([names.index(c.engine) for c in configs]), n)
    read_s = np.empty(n * m)
    combine = np.full(n * m, np.nan)      # measured DCP combine feature where a profile exists
    for reader, idx, gpu in reads.values():
        rows = (np.array(idx)[:, None] * m + np.arange(m)).ravel()
        read_s[rows] = kv_read_seconds(reader, ctx[rows], out[rows], batch[rows], kv[rows],
                                       dcp[rows])
        measured = dcp_combine_features(gpu, batch[rows], dcp[rows])
        if measured is not None:
            combine[rows] = measured
    return model.predict(Query(engine, ctx, out, batch, kv, dcp, read_s,
                               combine if np.isfinite(combine).any() else None))
