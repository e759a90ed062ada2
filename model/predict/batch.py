"""Vectorised predictions for many workloads x configurations at once (capacity sweeps, bench)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import numpy as np

from engine_advisor.model.engines import effective_share
from engine_advisor.model.fit.costmodel import CostModel, Prediction
from engine_advisor.model.hardware.silicon import silicon_for
from engine_advisor.model.physics.features import Case
from engine_advisor.model.predict.predictor import predictor_for
from engine_advisor.model.workload import Config, Workload

FIELDS = ("total", "total_lo", "total_hi", "prefill", "prefill_all", "tpot", "running",
          "capacity", "feasible")


def predict_grid(model: CostModel, workloads: Sequence[Workload],
                 configs: Sequence[Config]) -> Prediction:
    """Predictions for every (workload, config) pair, workload-major: row i*len(configs)+j.

    Workloads serving the same model on the same GPU type and TP size are predicted as one
    ``Case``. No coverage widening or feasibility checks: callers that need those use
    ``recommend``."""
    n, m = len(workloads), len(configs)
    pred = predictor_for(model)
    groups: dict[tuple, list[int]] = {}
    prev, group = (), []
    for i, w in enumerate(workloads):   # consecutive workloads usually share their model
        sig = _SIGNATURE(w)
        if sig != prev:
            key = _model_key(w)
            group = groups.get(key)
            if group is None:
                groups[key] = group = []
            prev = sig
        group.append(i)
    eng = np.array([c.engine for c in configs])
    dcp = np.array([float(c.dcp_size) for c in configs])
    preds, rows_list = [], []
    for idx in groups.values():
        first = workloads[idx[0]]
        gpu, tp = first.gpu_spec(), first.num_gpus
        k = len(idx)
        frac = np.array([pred.memory(c.engine, gpu.name).fraction for c in configs])
        ws = [workloads[i] for i in idx] if len(groups) > 1 else workloads
        shares = [w.requirements.prefix_reuse_share if w.requirements else 0.0 for w in ws]
        share = 0.0
        if any(shares):
            share = np.array([[effective_share(c.engine, s, w.context_tokens) for c in configs]
                              for s, w in zip(shares, ws, strict=True)]).ravel()
        batch, context, output = (np.repeat(np.array(v, dtype=float), m) for v in (
            [w.batch_size for w in ws], [w.context_tokens for w in ws],
            [w.output_tokens for w in ws]))
        case = Case(first.model_shape(), silicon_for(gpu), tp, np.tile(eng, k), batch,
                    context, output, np.tile(dcp, k), np.tile(frac, k), share)
        preds.append(pred.predict(case))
        rows_list.append((np.array(idx)[:, None] * m + np.arange(m)).ravel())
    if len(preds) == 1 and len(rows_list[0]) == n * m and n * m and rows_list[0][-1] == n * m - 1 \
            and np.all(np.diff(rows_list[0]) == 1):
        return preds[0]   # one group, already in order
    out = {f: np.empty(n * m, dtype=bool if f == "feasible" else float) for f in FIELDS}
    parts = np.empty((n * m, len(preds[0].step_parts[0]) if preds else 0))
    for p, rows in zip(preds, rows_list, strict=True):
        for f in FIELDS:
            out[f][rows] = getattr(p, f)
        parts[rows] = p.step_parts
    return Prediction(out["total"], out["total_lo"], out["total_hi"], out["prefill"],
                      out["prefill_all"], out["tpot"], parts, out["running"], out["capacity"],
                      out["feasible"])


# Fields that decide a workload's served model, GPU and TP size (compared on consecutive
# workloads: equal values, or the same config.json object)
_SIGNATURE = attrgetter("preset", "kv_bytes_per_token", "kv_cache_dtype", "model_weight_bytes",
                        "model", "gpu", "num_gpus", "hf_config")


def _model_key(w: Workload) -> tuple:
    return (w.preset, id(w.hf_config), w.kv_bytes_per_token, w.kv_cache_dtype,
            w.model_weight_bytes, w.model, w.gpu if isinstance(w.gpu, str) else id(w.gpu),
            w.num_gpus)
