"""A case's rows into features: each row's memory (``memory_fit``), its first prefill, its
decode steps and, when the batch does not fit, the waves after the first (``rows_into``)."""

from __future__ import annotations

import numpy as np
from numba import njit

from engine_advisor.model.formulas.layout import (
    FIRST_PREFILL,
    N_DECODE,
    N_PREFILL,
    R_STATE,
    STEP,
)
from engine_advisor.model.formulas.memory import N_FACTS, memory_fit
from engine_advisor.model.formulas.terms import batch_terms, decode_into, prefill_into


@njit(cache=True)
def rows_into(K, coll, curve, rows, X, facts):
    """Each row's features into ``X`` (``engine_advisor.model.physics.features.Features``) and, into
    ``facts`` (N_FACTS, n), what ``memory_fit`` says of its memory, from ``rows`` (N_ROW_FIELDS, n):
    engine reserve bytes, memory fraction, batch, context, output, DCP size, prefix share, routing
    diversity, whether the engine's budget holds the model's activation peak (``K[ACT_PEAK]``), the
    largest prefill pass it replays as a CUDA graph, its memory layout for the model and its memory
    knobs per row (``ROW_FIELDS``).

    How many sequences run at once (``memory_fit``: the engine runs what fits and queues the
    rest; when not even one fits, the batch is costed as if it ran at once), the first ``run``
    prompts' prefill, and ``output - 1`` decode steps at the mean context; when the batch does
    not fit, the rest are admitted one by one as running sequences finish (continuous
    batching: their prefills, a shared prefix warm, and ``b / run`` times the steps of ``run``
    sequences). Rows usually come in groups that differ only by configuration: a row's first
    prefill and batch terms are reused from the row before when their inputs are the same."""
    sc = np.empty((1, 2 * N_PREFILL + N_DECODE))     # a later wave's terms
    last_pf = (-1.0, -1.0, -1.0, -1.0)    # row i - 1's prefill: sequences, context, share, graph
    last_b, last_rho, gemm, moe, tp_comm = -1.0, -1.0, 0.0, 0.0, 0.0
    for i in range(X.shape[0]):
        b, c, o, d, s, rho = rows[2, i], rows[3, i], rows[4, i], rows[5, i], rows[6, i], rows[7, i]
        fitted = memory_fit(K, rows, i, b, c, o, d, s)
        run = fitted[0] if fitted[2] > 0.0 else b
        steps = max(o - 1.0, 0.0)
        ctx_mean = c + o / 2.0
        if last_pf == (run, c, s, rows[9, i]):
            for j in range(FIRST_PREFILL, STEP):
                X[i, j] = X[i - 1, j]
        else:
            prefill_into(K, coll, run, c, s, False, rows[9, i], X, i, FIRST_PREFILL)
            last_pf = (run, c, s, rows[9, i])
        if run != last_b or rho != last_rho:
            gemm, moe, tp_comm = batch_terms(K, coll, run, rho)
            last_b, last_rho = run, rho
        decode_into(K, coll, curve, run, ctx_mean, d, gemm, moe, tp_comm, rows[R_STATE, i], X,
                    i, STEP)
        if run >= b:                        # the whole batch at once (the usual case)
            for j in range(N_PREFILL):
                X[i, j] = X[i, FIRST_PREFILL + j]
            for j in range(N_DECODE):
                X[i, N_PREFILL + j] = steps * X[i, STEP + j]
        else:
            # continuous batching: ``run`` sequences at once, each waiting one admitted as a
            # running one finishes and frees its KV (its prompt prefilled then, a shared prefix
            # warm), so ``run`` keep decoding until the batch's b x (o - 1) tokens are out
            prefill_into(K, coll, b - run, c, s, True, rows[9, i], sc, 0, N_PREFILL)
            for j in range(N_PREFILL):
                X[i, j] = X[i, FIRST_PREFILL + j] + sc[0, N_PREFILL + j]
            for j in range(N_DECODE):
                X[i, N_PREFILL + j] = steps * (b / run) * X[i, STEP + j]
        for k in range(N_FACTS):
            facts[k, i] = fitted[k]
