"""Every compiled formula of the cost model, in one module (numba, ``cache=True``).

The physics is written once, as scalar functions over one row, and compiled: a recommendation's
few rows and a training grid of 80,000 rows run the same code (microseconds for the first,
milliseconds for the second). The modules that own each quantity document it and pack its
constants into the arrays these functions read:

- ``read_s``: one decode-attention call's seconds on a read curve (``model.hwprofile``);
- ``collective_s``: one collective (``model.silicon.Collective``);
- ``kv_capacity``, ``sequences_at_once``, ``max_running``: memory (``model.memory``);
- ``decode_into``, ``prefill_into``: the terms (``model.terms``; ``K`` packed by
  ``model.terms.Physics``, positions below);
- ``rows_into``: a case's rows, waves included (``model.costmodel.case_features``);
- ``predict_into``: coefficients x features, intervals (``model.predictor``).

They share one file because numba's on-disk cache is invalidated by the source file of the
function it compiled, not by the files of the functions it calls. ``NUMBA_DISABLE_JIT=1`` runs
them as plain Python (a test compares both).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

PREFILL_TERMS = ("pf_gemm", "pf_attn", "pf_comm", "pf_fixed", "pf_batch")
DECODE_TERMS = ("gemm", "kv_read", "state", "tp_comm", "dcp_comm", "layer_fixed", "seq_fixed",
                "step_fixed")
N_PREFILL = len(PREFILL_TERMS)
N_DECODE = len(DECODE_TERMS)
N_TERMS = N_PREFILL + N_DECODE
FIRST_PREFILL = N_TERMS            # a row of features: total terms | first prefill | one step
STEP = N_TERMS + N_PREFILL
CHUNK_TOKENS = 8192          # chunked-prefill budget per forward pass (both engines' default)
# Both engines preallocate the constant per-sequence state of linear-attention layers (vLLM's
# mamba/KDA state cache, SGLang's state pool) for their maximum running sequences: 256 by
# default (--max-num-seqs / --max-running-requests), or the batch when it is set higher.
DEFAULT_MAX_RUNNING = 256

# Positions in model.terms.Physics.K, the constants of one model on one GPU and TP size
(W_DENSE, Q_MISS, W_EXPERTS, MM, N_FULL, KV_CALL, ATTN_CALL, STATE, N_LAYERS, ACT, Q_GATHER,
 O_GATHER, WEIGHTS_PASS, ATTN_PF, ATTN_PF_LINEAR, MEMORY, WEIGHT_BYTES, TP, KV_GPU_TOKEN,
 STATE_GPU, READ_T0, READ_ASYM, READ_BPS) = range(23)
N_CONSTANTS = 23


@njit(cache=True)
def read_s(x: float, curve: np.ndarray, t0: float, asym: float, bps: float) -> float:
    """Seconds of one call reading ``x`` bytes on a read curve given as ``curve`` (4, m): knot
    bytes, seconds and their logs (``ReadCurve.table``), or, with no knots, ``x / bps``."""
    m = curve.shape[1]
    if m == 0:
        return x / bps
    kb, kt, lkb, lkt = curve[0], curve[1], curve[2], curve[3]
    if x < kb[0]:
        return t0 + (kt[0] - t0) * (x if x > 0.0 else 0.0) / kb[0]
    if x > kb[m - 1]:
        return kt[m - 1] + (x - kb[m - 1]) / asym
    if m == 1:
        return kt[0]
    lx = math.log(x)
    i = np.searchsorted(lkb, lx)
    if lkb[i] == lx:
        return kt[i]
    return math.exp(lkt[i - 1] + (lx - lkb[i - 1]) * (lkt[i] - lkt[i - 1]) / (lkb[i] - lkb[i - 1]))


@njit(cache=True)
def read_many(x: np.ndarray, curve: np.ndarray, t0: float, asym: float,
               bps: float) -> np.ndarray:
    out = np.empty(x.shape[0])
    for i in range(x.shape[0]):
        out[i] = read_s(x[i], curve, t0, asym, bps)
    return out



@njit(cache=True)
def collective_s(nbytes: float, c: np.ndarray) -> float:
    """Seconds of one collective of ``nbytes`` per rank whose parameters are ``c`` =
    ``Collective.params``: (latency, bandwidth, factor, small_max, small_latency,
    small_bandwidth)."""
    if c[2] == 0.0:
        return 0.0
    if nbytes <= c[3]:
        return c[4] + nbytes / c[5]
    return c[0] + nbytes * (c[2] / c[1])


@njit(cache=True)
def collective_many(nbytes: np.ndarray, c: np.ndarray) -> np.ndarray:
    out = np.empty(nbytes.shape[0])
    for i in range(nbytes.shape[0]):
        out[i] = collective_s(nbytes[i], c)
    return out



@njit(cache=True)
def max_running(batch: float) -> float:
    """The running-sequence limit an engine is launched with for a batch (the state pool)."""
    return max(float(DEFAULT_MAX_RUNNING), np.floor(batch))



@njit(cache=True)
def kv_capacity(reserve: float, fraction: float, gpu_memory: float, weight_bytes: float,
                tp: float, kv_bytes_per_gpu_token: float, dcp: float,
                state_pool_bytes: float = 0.0) -> float:
    """Tokens of KV one instance holds: the bytes per GPU left after weights, the engine's
    ``reserve`` (``engine_reserve``) and the preallocated linear-attention state pool, over
    the KV bytes per token each GPU holds (``dcp`` GPUs share a token). Weights of 0 give an
    upper bound; a model without KV gets 2^62."""
    budget = (fraction - reserve) * gpu_memory - weight_bytes / tp - state_pool_bytes
    if budget <= 0.0:
        return 0.0
    if kv_bytes_per_gpu_token <= 0.0:
        return float(2 ** 62)
    return np.floor(budget / (kv_bytes_per_gpu_token / dcp))



@njit(cache=True)
def sequences_at_once(capacity_tokens: float, batch: float, context: float, output: float,
                      share: float = 0.0) -> float:
    """How many of ``batch`` sequences fit at once: each holds its uncached prompt and its
    output; a cached shared prefix is held once (their state lives in the preallocated pool)."""
    shared = share * context
    per_seq = context - shared + output
    fit = np.floor((capacity_tokens - shared) / max(per_seq, 1.0))
    return min(max(fit, 0.0), batch)



@njit(cache=True)
def decode_into(K, coll, curve, b, c, d, out, at):
    """Write the ``DECODE_TERMS`` of one step of ``b`` sequences at context ``c``, DCP ``d``
    into ``out[at:at + N_DECODE]``."""
    d = max(d, 1.0)
    gemm = max(K[W_DENSE] + K[W_EXPERTS] * (1.0 - K[Q_MISS] ** b), b * K[MM])
    kv = 0.0
    dcp_comm = 0.0
    if K[N_FULL] > 0.0:
        ctx = b * c / d
        kv = K[N_FULL] * max(read_s(ctx * K[KV_CALL], curve, K[READ_T0], K[READ_ASYM],
                                    K[READ_BPS]), ctx * K[ATTN_CALL])
        if d > 1.0:
            # all-gather the queries of the group's heads, then the partial outputs and
            # log-sum-exps to combine them
            ag = coll[int(d)]
            dcp_comm = K[N_FULL] * (collective_s(b * d * K[Q_GATHER], ag)
                                    + collective_s(b * d * K[O_GATHER], ag))
    out[at] = gemm
    out[at + 1] = kv
    out[at + 2] = b * K[STATE]
    out[at + 3] = 2.0 * K[N_LAYERS] * collective_s(b * K[ACT], coll[0])
    out[at + 4] = dcp_comm
    out[at + 5] = K[N_LAYERS]
    out[at + 6] = b
    out[at + 7] = 1.0


@njit(cache=True)
def prefill_into(K, coll, b, L, s, warm, out, at):
    """Write the ``PREFILL_TERMS`` of prefilling ``b`` prompts of ``L`` tokens, a share ``s``
    of each cached, into ``out[at:at + N_PREFILL]``: the shared prefix is computed once, by
    the first prompt, unless ``warm`` (an earlier wave left it in the cache)."""
    first = 0.0 if warm else 1.0    # the prompt that computes the shared prefix
    new = max(L * (b * (1.0 - s) + first * s), 1.0)
    chunks = np.ceil(new / CHUNK_TOKENS)
    chunk = new / chunks
    out[at] = chunks * max(chunk * K[MM], K[WEIGHTS_PASS])
    out[at + 1] = (K[ATTN_PF] * L * L * (first + (b - first) * (1.0 - s * s))
                   + K[ATTN_PF_LINEAR] * new)
    out[at + 2] = chunks * (2.0 * K[N_LAYERS]) * collective_s(chunk * K[ACT], coll[0])
    out[at + 3] = chunks * K[N_LAYERS]
    out[at + 4] = 1.0



@njit(cache=True)
def rows_into(K, coll, curve, reserve, fraction, batch, context, output, dcp, share,
              X, running, capacity, feasible):
    """Each row's features into ``X`` (see ``Features``) and its sequences at once, KV
    capacity and feasibility: the KV capacity (``model.memory.kv_capacity``), how many
    sequences run at once (the engine runs what fits and queues the rest; when not even one
    fits, the batch is costed as if it ran at once), then ``full`` waves of ``run`` sequences
    and one of the ``rest``, each a prefill (a shared prompt prefix stays cached after the
    first wave) and ``output - 1`` decode steps at the mean context."""
    scratch = np.empty(2 * N_PREFILL + N_DECODE)
    for i in range(X.shape[0]):
        b, c, o, d, s = batch[i], context[i], output[i], dcp[i], share[i]
        cap = kv_capacity(reserve[i], fraction[i], K[MEMORY], K[WEIGHT_BYTES], K[TP],
                          K[KV_GPU_TOKEN], d, K[STATE_GPU] * max_running(b))
        fits = sequences_at_once(cap, b, c, o, s)
        run = fits if fits >= 1.0 else b
        full = np.floor(b / run)
        rest = b - full * run
        steps = max(o - 1.0, 0.0)
        ctx_mean = c + o / 2.0
        row = X[i]
        prefill_into(K, coll, run, c, s, False, row, FIRST_PREFILL)
        decode_into(K, coll, curve, run, ctx_mean, d, row, STEP)
        if full == 1.0 and rest <= 0.0:     # the whole batch at once (the usual case)
            for j in range(N_PREFILL):
                row[j] = row[FIRST_PREFILL + j]
            for j in range(N_DECODE):
                row[N_PREFILL + j] = steps * row[STEP + j]
        else:
            rest1 = max(rest, 1.0)
            if s > 0.0:
                prefill_into(K, coll, run, c, s, True, scratch, 0)
            else:                           # no shared prefix: a warm prefill is a cold one
                for j in range(N_PREFILL):
                    scratch[j] = row[FIRST_PREFILL + j]
            prefill_into(K, coll, rest1, c, s, True, scratch, N_PREFILL)
            decode_into(K, coll, curve, rest1, ctx_mean, d, scratch, 2 * N_PREFILL)
            has_rest = 1.0 if rest > 0.0 else 0.0
            for j in range(N_PREFILL):
                row[j] = (row[FIRST_PREFILL + j] + (full - 1.0) * scratch[j]
                          + has_rest * scratch[N_PREFILL + j])
            for j in range(N_DECODE):
                row[N_PREFILL + j] = steps * (full * row[STEP + j]
                                              + has_rest * scratch[2 * N_PREFILL + j])
        running[i] = run
        capacity[i] = cap
        feasible[i] = fits >= 1.0


