"""Vectorised predictions for many workloads x configurations at once (capacity sweeps, bench)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.capabilities import effective_share
from model.costmodel import Case, CostModel, Prediction
from model.predictor import predictor_for
from model.recommend import memory_choice
from model.silicon import silicon_for
from model.workload import Config, Workload


def predict_grid(model: CostModel, workloads: Sequence[Workload],
                 configs: Sequence[Config]) -> Prediction:
    """Predictions for every (workload, config) pair, workload-major: row i*len(configs)+j.

    Workloads serving the same model on the same GPU type and TP size are predicted as one
    ``Case``. No coverage widening or feasibility checks: callers that need those use
    ``recommend``."""
    n, m = len(workloads), len(configs)
    pred = predictor_for(model)
    groups: dict[tuple, list[int]] = {}
    shapes, gpus = {}, {}
    for i, w in enumerate(workloads):
        shape = w.model_shape()
        gpu = w.gpu_spec()
        key = (shape.key, shape.weight_bytes, gpu.name, gpu.memory_bytes, w.num_gpus)
        shapes.setdefault(key, shape)
        gpus.setdefault(key, gpu)
        groups.setdefault(key, []).append(i)
    eng = np.array([c.engine for c in configs])
    dcp = np.array([float(c.dcp_size) for c in configs])
    out = {f: np.empty(n * m) for f in ("total", "total_lo", "total_hi", "prefill",
                                        "prefill_all", "tpot", "running", "capacity")}
    out["feasible"] = np.empty(n * m, dtype=bool)
    parts = None
    for key, idx in groups.items():
        gpu, tp = gpus[key], key[4]
        ws = [workloads[i] for i in idx]
        k = len(ws)
        frac = np.array([memory_choice(model, c.engine, gpu.name).fraction for c in configs])
        if any(w.requirements and w.requirements.prefix_reuse_share for w in ws):
            share = np.array([[effective_share(c.engine, w.requirements.prefix_reuse_share,
                                               w.context_tokens)
                               if w.requirements else 0.0 for c in configs]
                              for w in ws]).ravel()
        else:
            share = 0.0
        col = lambda attr: np.repeat(np.array([float(getattr(w, attr)) for w in ws]), m)  # noqa
        case = Case(shapes[key], silicon_for(gpu), tp, np.tile(eng, k), col("batch_size"),
                    col("context_tokens"), col("output_tokens"), np.tile(dcp, k),
                    np.tile(frac, k), share)
        p = pred.predict(case)
        rows = (np.array(idx)[:, None] * m + np.arange(m)).ravel()
        for f in out:
            out[f][rows] = getattr(p, f)
        if parts is None:
            parts = np.empty((n * m, p.step_parts.shape[1]))
        parts[rows] = p.step_parts
    return Prediction(out["total"], out["total_lo"], out["total_hi"], out["prefill"],
                      out["prefill_all"], out["tpot"], parts, out["running"], out["capacity"],
                      out["feasible"])
