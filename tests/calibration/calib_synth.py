"""Synthetic dataset rows from known engine efficiencies (the hidden truth of e2e tests)."""

from __future__ import annotations

import itertools

import numpy as np

from engine_advisor.model.fit.dataset import Measurement
from engine_advisor.model.fit.estimator import PRIOR
from engine_advisor.model.fit.rows import row_case
from engine_advisor.model.physics.features import case_features
from engine_advisor.model.physics.terms import TERMS

KV = 2_000_000   # large KV bytes per token: KV reads dominate already at a few K tokens

# Two engines whose best configuration flips inside 2K..16K context at batch 4: SGLang with
# DCP 8 reads an eighth of the KV per GPU but pays a larger fixed cost per step.
TRUTH = {
    "vllm": {**PRIOR, "kv_read": 1.25, "step_fixed": 1e-3, "pf_fixed": 3e-3},
    "sglang": {**PRIOR, "kv_read": 1.4, "step_fixed": 1e-2, "pf_fixed": 4e-3},
}
DCP = {"vllm": 1, "sglang": 8}


def coefficients(truth: dict[str, float]) -> np.ndarray:
    return np.array([truth[t] for t in TERMS])


def rows(truth: dict[str, dict[str, float]] = TRUTH, dcp: dict[str, int] = DCP,
         contexts=(2048, 4096, 8192, 16384, 32768), batches=(1, 2, 4, 8), outputs=(32, 128),
         mem_fraction: float = 0.9, kv: int = KV) -> list[Measurement]:
    out = []
    for engine, coefs in truth.items():
        c = coefficients(coefs)
        for ctx, b, o in itertools.product(contexts, batches, outputs):
            r = Measurement(engine=engine, gpu="B300", num_gpus=8, dcp_size=dcp[engine],
                            mem_fraction=mem_fraction, context_tokens=ctx, output_tokens=o,
                            batch_size=b, kv_bytes_per_token=kv, total_s=1.0, source="synthetic")
            f = case_features(row_case(r))
            out.append(r.model_copy(update={"total_s": float(f.total[0] @ c),
                                            "ttft_s": float(f.prefill[0] @ c),
                                            "decode_step_s": float(f.tpot[0] @ c)}))
    return out
