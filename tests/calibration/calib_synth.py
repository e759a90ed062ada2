"""Synthetic dataset rows from known cost-model coefficients (the hidden truth of e2e tests)."""

from __future__ import annotations

import itertools

import numpy as np

from model.costmodel import training_matrix
from model.dataset import Measurement
from model.estimator import COEF_NAMES, QTY_PREFILL, QTY_TOTAL, QTY_TPOT, EngineCostModel

KV = 2_000_000   # large KV bytes per token: KV reads dominate already at a few K tokens

# Two engines whose best configuration flips inside 2K..16K context at batch 4.
TRUTH = {
    "vllm": {"prefill_fixed_s": 0.01, "prefill_s_per_mtoken": 1.5, "prefill_attn_s_per_unit": 0.02,
             "step_fixed_s": 0.003, "step_s_per_seq": 1e-4, "kv_efficiency_inv": 1.25,
             "dcp_sync_s_per_log2": 0.002, "dcp_combine_s_per_seq": 2e-5},
    "sglang": {"prefill_fixed_s": 0.012, "prefill_s_per_mtoken": 1.7,
               "prefill_attn_s_per_unit": 0.02,
               "step_fixed_s": 0.004, "step_s_per_seq": 1e-4, "kv_efficiency_inv": 1.4,
               "dcp_sync_s_per_log2": 0.002, "dcp_combine_s_per_seq": 2e-4},
}
DCP = {"vllm": 1, "sglang": 8}


def estimator(coefs: dict[str, float]) -> EngineCostModel:
    est = EngineCostModel()
    est.coef_ = np.array([coefs[n] for n in COEF_NAMES])
    return est


def rows(truth: dict[str, dict[str, float]] = TRUTH, dcp: dict[str, int] = DCP,
         contexts=(2048, 4096, 8192, 16384, 32768), batches=(1, 2, 4, 8), outputs=(32, 128),
         mem_fraction: float = 0.9, kv: int = KV) -> list[Measurement]:
    out = []
    for engine, coefs in truth.items():
        est = estimator(coefs)
        for ctx, b, o in itertools.product(contexts, batches, outputs):
            r = Measurement(engine=engine, gpu="B300", num_gpus=8, dcp_size=dcp[engine],
                            mem_fraction=mem_fraction, context_tokens=ctx, output_tokens=o,
                            batch_size=b, kv_bytes_per_token=kv, total_s=1.0, source="synthetic")
            X, _ = training_matrix([r])
            vals = {}
            for qty in (QTY_TOTAL, QTY_PREFILL, QTY_TPOT):
                Xq = X.copy()
                Xq[:, 6] = qty
                vals[qty] = float(est.predict_rows(Xq)[0])
            out.append(r.model_copy(update={"total_s": vals[QTY_TOTAL], "ttft_s": vals[QTY_PREFILL],
                                            "tpot_s": vals[QTY_TPOT]}))
    return out
