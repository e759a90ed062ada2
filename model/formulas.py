"""Every compiled formula of the cost model, in one module (numba, ``cache=True``).

The physics is written once, as scalar functions over one row, and compiled: a recommendation's
few rows and a training grid of 80,000 rows run the same code (microseconds for the first,
milliseconds for the second). The modules that own each quantity document it and pack its
constants into the arrays these functions read:

- ``read_s``: one decode-attention call's seconds on a read curve
  (``engine_advisor.model.hardware.profiles``);
- ``collective_s``: one collective (``engine_advisor.model.hardware.silicon.Collective``);
- ``memory_fit``: KV capacity, state slots and the sequences that run at once, per engine
  (``engine_advisor.model.physics.memory``; each engine's layout
  ``engine_advisor.model.engines.base.StateLayout``);
- ``batch_terms``, ``decode_into``, ``prefill_into``: the terms
  (``engine_advisor.model.physics.terms``; ``K`` packed by
  ``engine_advisor.model.physics.terms.Physics``, positions below);
- ``rows_into``: a case's rows, waves included
  (``engine_advisor.model.physics.features.case_features``);
- ``predict_into``: coefficients x features, intervals; ``predict_rows`` both passes in one
  call (``engine_advisor.model.predict.predictor``).

They share one file because numba's on-disk cache is invalidated by the source file of the
function it compiled, not by the files of the functions it calls. ``NUMBA_DISABLE_JIT=1`` runs
them as plain Python (a test compares both).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

PREFILL_TERMS = ("pf_gemm", "pf_moe", "pf_attn", "pf_mla", "pf_linear", "pf_comm", "pf_fixed",
                 "pf_moe_fixed", "pf_batch")
DECODE_TERMS = ("gemm", "moe", "kv_read", "mla_read", "dcp_read", "state", "tp_comm", "dcp_comm",
                "dcp_fixed", "layer_fixed", "moe_fixed", "seq_fixed", "step_fixed")
N_PREFILL = len(PREFILL_TERMS)
N_DECODE = len(DECODE_TERMS)
N_TERMS = N_PREFILL + N_DECODE
FIRST_PREFILL = N_TERMS            # a row of features: total terms | first prefill | one step
STEP = N_TERMS + N_PREFILL
ROW_FIELDS = ("reserve", "fraction", "batch", "context", "output", "dcp", "share", "diversity",
              "activations", "graph_tokens",
              # the engine's memory layout for this model
              # (engine_advisor.model.engines.base.StateLayout)
              "mem_mode", "unit_bytes", "block_tokens", "state_units", "attn_units",
              "default_running", "state_ratio", "state_bytes",
              # the memory knobs as launched (engine_advisor.model.engines.base.MemoryKnobs; 0: the
              # default), and whether to choose them for the workload (a recommendation's rows)
              "max_running", "state_slots", "no_prefix_cache", "advise")
N_ROW_FIELDS = len(ROW_FIELDS)
(R_MODE, R_UNIT, R_BLOCK, R_STATE_UNITS, R_ATTN_UNITS, R_DEFAULT_RUNNING, R_RATIO, R_STATE,
 R_MAX_RUNNING, R_SLOTS, R_NO_PREFIX, R_ADVISE) = range(10, N_ROW_FIELDS)


def fill_sizes(rows, batch, context, output, share, diversity) -> None:
    """Write a query's sizes into the ``ROW_FIELDS`` rows its configurations' fields were
    filled in (``engine_advisor.model.physics.features.static_rows``)."""
    rows[2] = batch
    rows[3] = context
    rows[4] = output
    rows[6] = share
    rows[7] = diversity
CHUNK_TOKENS = 8192          # chunked-prefill budget per forward pass (both engines' default)
# engine_advisor.model.engines.base: NO_STATE, PAGED, SPLIT (a StateLayout's mode)
PAGED, SPLIT = 1.0, 2.0
# SGLang's default running-request limit: int(KV tokens / context length x 512), within these
ESTIMATE_LO, ESTIMATE_HI = 2048.0, 4096.0
PROFILED_MAX = 8192.0        # vLLM profiles at most max_num_batched_tokens sequences
# What binds the sequences running at once (a prediction's ``running_limit``)
(LIMIT_NONE, LIMIT_KV, LIMIT_STATE, LIMIT_RUNNING) = (0.0, 1.0, 2.0, 3.0)
# The memory knobs a recommendation proposes (engine_advisor.model.engines.base.knobs_of reads the
# code)
(KNOB_NONE, KNOB_RUNNING, KNOB_SLOTS, KNOB_NO_PREFIX) = (0.0, 1.0, 2.0, 3.0)
# per row: running, capacity, one fits, all fit, what binds, knob, running limit, state slots;
# with the engine's default knobs: running, capacity, what binds
N_FACTS = 11

# Positions in engine_advisor.model.physics.terms.Physics.K, the constants of one model on one GPU
# and TP size (a tuple of floats: unlike an array, passing it on costs no reference counting)
(W_DENSE, LOG_Q_MISS, W_EXPERTS, MM, N_FULL, KV_CALL, ATTN_CALL, STATE, N_LAYERS, ACT, Q_GATHER,
 O_GATHER, WEIGHTS_PASS, ATTN_PF, ATTN_PF_LINEAR, MEMORY, WEIGHT_BYTES, TP, KV_GPU_TOKEN,
 WINDOW_GPU, READ_T0, READ_ASYM, READ_BPS, MM_MOE, IS_MLA, ACT_PEAK, N_MOE_LAYERS,
 MOE_CALLS, ACT_SEQ, HBM_BPS, MAX_LEN, LIN_PF, LIN_STEP) = range(33)
N_CONSTANTS = 33
# Columns of the prefill terms (offsets into PREFILL_TERMS) that prefill_into writes
(P_GEMM, P_MOE, P_ATTN, P_MLA, P_LINEAR, P_COMM, P_FIXED, P_MOE_FIXED, P_BATCH) = range(9)
# Columns of the decode terms (offsets into DECODE_TERMS) that decode_into writes
(D_GEMM, D_MOE, D_KV, D_MLA, D_DCP_READ, D_STATE, D_TP, D_DCP_COMM, D_DCP_FIXED, D_LAYER,
 D_MOE_FIXED, D_SEQ, D_STEP) = range(13)


@njit(cache=True, inline="always")
def read_s(x: float, curve: np.ndarray, t0: float, asym: float, bps: float) -> float:
    """Seconds of one call reading ``x`` bytes on a read curve given as ``curve`` (4, m): knot
    bytes, seconds and their logs (``ReadCurve.table``), or, with no knots, ``x / bps``."""
    m = curve.shape[1]
    if m == 0:
        return x / bps
    if x < curve[0, 0]:
        return t0 + (curve[1, 0] - t0) * (x if x > 0.0 else 0.0) / curve[0, 0]
    if x > curve[0, m - 1]:
        return curve[1, m - 1] + (x - curve[0, m - 1]) / asym
    if m == 1:
        return curve[1, 0]
    lx = math.log(x)
    lo, hi = 0, m - 1           # the first knot with log bytes >= lx (binary search)
    while lo < hi:
        mid = (lo + hi) // 2
        if curve[2, mid] < lx:
            lo = mid + 1
        else:
            hi = mid
    i = lo
    if curve[2, i] == lx:
        return curve[1, i]
    return math.exp(curve[3, i - 1] + (lx - curve[2, i - 1]) * (curve[3, i] - curve[3, i - 1])
                    / (curve[2, i] - curve[2, i - 1]))


@njit(cache=True)
def read_many(x: np.ndarray, curve: np.ndarray, t0: float, asym: float,
               bps: float) -> np.ndarray:
    out = np.empty(x.shape[0])
    for i in range(x.shape[0]):
        out[i] = read_s(x[i], curve, t0, asym, bps)
    return out


@njit(cache=True, inline="always")
def collective_s(nbytes: float, table: np.ndarray, k: int) -> float:
    """Seconds of one collective of ``nbytes`` per rank whose parameters are row ``k`` of
    ``table``, a stack of ``Collective.params``: (latency, bandwidth, factor, small_max,
    small_latency, small_bandwidth)."""
    if table[k, 2] == 0.0:
        return 0.0
    if nbytes <= table[k, 3]:
        return table[k, 4] + nbytes / table[k, 5]
    return table[k, 0] + nbytes * (table[k, 2] / table[k, 1])


@njit(cache=True)
def collective_many(nbytes: np.ndarray, table: np.ndarray, k: int) -> np.ndarray:
    out = np.empty(nbytes.shape[0])
    for i in range(nbytes.shape[0]):
        out[i] = collective_s(nbytes[i], table, k)
    return out


@njit(cache=True, inline="always")
def kv_budget(K, rows, i, profiled: float) -> float:
    """Bytes per GPU a row's memory fraction leaves for KV and state: fraction x memory, less
    the engine's reserve, the weights' share and, where the engine's budget holds it, the
    activation peak of a profiled pass (``K[ACT_PEAK]``) and its sampler's ``profiled`` rows
    (vLLM profiles ``max_num_seqs`` of them, ``K[ACT_SEQ]`` bytes each)."""
    act = rows[8, i] * (K[ACT_PEAK] + K[ACT_SEQ] * min(profiled, PROFILED_MAX))
    return rows[1, i] * K[MEMORY] - rows[0, i] - K[WEIGHT_BYTES] / K[TP] - act


@njit(cache=True, inline="always")
def _floor_div(x: float, y: float) -> float:
    return np.floor(x / y) if y > 0.0 else float(2 ** 62)


@njit(cache=True)
def pool_of(K, rows, i, d, req, slots_req, no_prefix):
    """The memory one instance of row ``i``'s engine holds at DCP ``d``, launched with a
    running-request limit ``req``, ``slots_req`` state slots and the prefix cache off
    (``no_prefix``; 0 / False: the defaults), as its engine lays it out (``rows``' ``R_MODE``,
    the layout's fields ``engine_advisor.model.engines.base.StateLayout``):

    - no state: KV tokens = budget / (KV bytes per token per GPU / d); what else a sequence
      holds (its sliding windows' KV, a state without an engine layout) in tokens of KV;
    - PAGED (vLLM): pool blocks = budget // (page x layers per group), less the null block; a
      request holds ``attn_units`` x ceil(tokens / (block x d)) + ``state_units`` of them. The
      capacity reported is the engine's log line: the pool over one request of the model's
      maximum length, times that length;
    - SPLIT (SGLang): state slots = budget x r / (1 + r) // state (or as launched), the KV pool
      the rest (x d: DCP stripes tokens, not state); at most slots // ``state_units``
      requests run (// 1 with the prefix cache off), within SGLang's own limits.

    A request of ``n`` tokens takes ``attn x ceil(n / unit_tokens) + fixed`` of the ``units``.
    Returns (units, unit_tokens, attn, fixed, running limit, capacity in tokens, state slots,
    slots per request)."""
    mode = rows[R_MODE, i]
    default = rows[R_DEFAULT_RUNNING, i]
    if mode == PAGED:
        limit = req if req > 0.0 else default
        total = np.floor(kv_budget(K, rows, i, limit) / rows[R_UNIT, i])
        au, blk = rows[R_ATTN_UNITS, i], rows[R_BLOCK, i]
        L = K[MAX_LEN]
        cap = np.floor(max(total, 0.0) / (au * np.ceil(np.ceil(L / d) / blk)
                                          + rows[R_STATE_UNITS, i]) * L)
        return (total - 1.0, blk * d, au, rows[R_STATE_UNITS, i], limit, cap, 0.0, 0.0)
    if mode == SPLIT:
        unit, r = rows[R_UNIT, i], rows[R_RATIO, i]
        div = 1.0 if no_prefix else rows[R_STATE_UNITS, i]
        rest = kv_budget(K, rows, i, 0.0)
        if slots_req > 0.0:
            slots = slots_req
        elif no_prefix and req > 0.0:
            slots = req
        else:
            slots = np.floor(max(rest, 0.0) * r / (1.0 + r) / unit)
        tokens = max(_floor_div(rest - slots * unit, K[KV_GPU_TOKEN]), 0.0)
        estimate = min(max(np.floor(tokens / K[MAX_LEN] * 512.0), ESTIMATE_LO), ESTIMATE_HI)
        limit = min(req if req > 0.0 else estimate, np.floor(tokens / 2.0), np.floor(slots / div))
        return (tokens * d, 1.0, 1.0, 0.0, limit, tokens * d, slots, div)
    kv = K[KV_GPU_TOKEN] / d
    limit = req if req > 0.0 else default
    budget = kv_budget(K, rows, i, limit)
    cap = _floor_div(budget, kv) if budget > 0.0 else 0.0
    other = K[WINDOW_GPU] + rows[R_STATE, i]
    fixed = other / kv if kv > 0.0 else 0.0
    return (cap, 1.0, 1.0, fixed, limit, cap, 0.0, 0.0)


@njit(cache=True)
def memory_fit(K, rows, i, b, c, o, d, s):
    """Row ``i``'s memory at ``b`` sequences of ``c`` + ``o`` tokens, DCP ``d``, a share ``s``
    of each prompt cached (held once): its engine's pool (``pool_of``) with the knobs as
    launched, or with ``R_ADVISE`` chosen for the workload where they let more of it run:
    vLLM's ``--max-num-seqs`` (the sequences that fit: the sampler's profiled rows and the
    CUDA graphs follow it) and, past the engines' default limit, either engine's running
    limit; SGLang's state slots sized to the batch (``--disable-radix-cache
    --max-running-requests n`` without prefix reuse, ``--max-mamba-cache-size 5n
    --max-running-requests n`` with it).

    Returns (sequences at once, capacity in tokens, one fits, the memory holds them all, what
    binds (LIMIT_*), knob (KNOB_*), running limit as launched or advised (0: the default),
    state slots, and the sequences at once, capacity and what binds with the engine's default
    knobs)."""
    mode = rows[R_MODE, i]
    req, slots_req = rows[R_MAX_RUNNING, i], rows[R_SLOTS, i]
    no_prefix = rows[R_NO_PREFIX, i] > 0.0
    shared = s * c
    knob = KNOB_NONE
    run0, cap0, bind0 = -1.0, 0.0, LIMIT_NONE
    if rows[R_ADVISE, i] > 0.0 and req <= 0.0:
        units, unit, au, fixed, limit, cap, slots, div = pool_of(K, rows, i, d, 0.0, 0.0,
                                                                 False)
        attn = au * np.ceil((c - shared + o) / unit)
        each = attn + fixed
        fit = min(max(np.floor((units - au * np.ceil(shared / unit)) / each), 0.0), b)
        run0, cap0 = min(fit, limit), min(cap, float(2 ** 62))
        bind0 = _binds(mode, run0, fit, b, attn, fixed, slots, div)
        if mode == PAGED:
            # the limit at what fits; fewer profiled sequences leave the pool a little more
            req, knob = max(fit, 1.0), KNOB_RUNNING
            units = pool_of(K, rows, i, d, req, 0.0, False)[0]
            more = min(b, np.floor((units - au * np.ceil(shared / unit)) / each))
            if more > req:
                units = pool_of(K, rows, i, d, more, 0.0, False)[0]
                if np.floor((units - au * np.ceil(shared / unit)) / each) >= more:
                    req = more
        elif mode == SPLIT and run0 < b:
            # each running request: its state slots and its KV; a shared prefix's KV once
            keep = s > 0.0                     # prefix reuse wanted: the radix cache stays
            per = (div if keep else 1.0) * rows[R_UNIT, i] + (c - shared + o) * K[
                KV_GPU_TOKEN] / d
            n = min(b, np.floor((kv_budget(K, rows, i, 0.0) - shared * K[KV_GPU_TOKEN] / d)
                                / per))
            if n > run0:
                req = n
                if keep:
                    knob, slots_req = KNOB_SLOTS, n * div
                else:
                    knob, no_prefix = KNOB_NO_PREFIX, True
        elif mode != SPLIT and b > limit:
            req, knob = b, KNOB_RUNNING
    units, unit, au, fixed, limit, cap, slots, div = pool_of(K, rows, i, d, req, slots_req,
                                                             no_prefix)
    attn = au * np.ceil((c - shared + o) / unit)
    fit = min(max(np.floor((units - au * np.ceil(shared / unit)) / (attn + fixed)), 0.0), b)
    mem = min(fit, np.floor(slots / div)) if mode == SPLIT else fit
    run = min(fit, limit)
    bind = _binds(mode, run, fit, b, attn, fixed, slots, div)
    cap = min(cap, float(2 ** 62))
    if run0 < 0.0:
        run0, cap0, bind0 = run, cap, bind
    shown = limit if knob != KNOB_NONE or rows[R_MAX_RUNNING, i] > 0.0 else 0.0
    return (run, cap, 1.0 if run >= 1.0 else 0.0, 1.0 if mem >= b else 0.0, bind, knob, shown,
            slots, run0, cap0, bind0)


@njit(cache=True, inline="always")
def _binds(mode, run, fit, b, attn, fixed, slots, div):
    """What binds ``run`` of ``b`` sequences (LIMIT_*): none when all run; the memory when it
    holds no more (the pool's KV or, in vLLM's pages, the state when it takes the larger
    share of a request's pages; SGLang's state slots); else the running-request limit."""
    if run >= b:
        return LIMIT_NONE
    if run >= fit:
        return LIMIT_KV if mode != PAGED or attn >= fixed else LIMIT_STATE
    if mode == SPLIT and run >= np.floor(slots / div):
        return LIMIT_STATE
    return LIMIT_RUNNING


@njit(cache=True, inline="always")
def batch_terms(K, coll, b, rho=1.0):
    """(gemm, moe, tp_comm) of a decode step of ``b`` sequences: the terms that do not depend
    on the context. ``rho`` is the batch's routing diversity: its tokens route like
    ``1 + rho (b - 1)`` independent tokens (1 for a trained router; a random-weight checkpoint
    can route far fewer apart, ``engine_advisor.model.fit.costmodel``)."""
    gemm = max(K[W_DENSE], b * K[MM])
    # expected share of a layer's experts the batch touches: 1 - q^t, q = 1 - k / E
    t = 1.0 + rho * (b - 1.0)
    moe = max(-K[W_EXPERTS] * math.expm1(t * K[LOG_Q_MISS]), b * K[MM_MOE])
    return gemm, moe, 2.0 * K[N_LAYERS] * collective_s(b * K[ACT], coll, 0)


@njit(cache=True, inline="always")
def decode_into(K, coll, curve, b, c, d, gemm, moe, tp_comm, state_b, out, r, at):
    """Write the ``DECODE_TERMS`` of one step of ``b`` sequences at context ``c``, DCP ``d`` into
    ``out[r, at:at + N_DECODE]``, given its ``batch_terms`` and the bytes of one sequence's
    linear-attention state per GPU at its engine's dtypes (``state_b``: read and written back each
    step, or its recurrent update's FLOPs if those take longer; plus a sliding window's KV read,
    ``K[STATE]``); ``curve`` (levels, 4, m) holds a read curve per DCP size
    (``engine_advisor.model.physics.terms.dcp_read_levels``). The KV read goes to ``kv_read`` (GQA /
    MHA) or ``mla_read`` (MLA's latent) without DCP, to ``dcp_read`` with it: each engine's DCP
    attention kernel is its own term."""
    d = max(d, 1.0)
    kv = 0.0
    dcp_comm = 0.0
    dcp_fixed = 0.0
    if K[N_FULL] > 0.0:
        # per rank: 1 / d of the context's bytes; the queries of all d ranks' heads are
        # gathered, so its FLOPs do not fall with d and its read is the curve of d x the
        # heads (level d of ``curve``, engine_advisor.model.physics.terms.dcp_read_levels)
        level = min(int(d), curve.shape[0] - 1)
        kv = K[N_FULL] * max(read_s(b * c / d * K[KV_CALL], curve[level], K[READ_T0],
                                    K[READ_ASYM], K[READ_BPS]), b * c * K[ATTN_CALL])
        if d > 1.0:
            # all-gather the queries of the group's heads, then the partial outputs and
            # log-sum-exps to combine them; one merge (and its launches) per layer
            ag = int(d)
            dcp_comm = K[N_FULL] * (collective_s(b * d * K[Q_GATHER], coll, ag)
                                    + collective_s(b * d * K[O_GATHER], coll, ag))
            dcp_fixed = K[N_FULL]
    for j in range(N_DECODE):
        out[r, at + j] = 0.0
    out[r, at + D_GEMM] = gemm
    out[r, at + D_MOE] = moe
    if d > 1.0:
        out[r, at + D_DCP_READ] = kv
    elif K[IS_MLA] > 0.0:
        out[r, at + D_MLA] = kv
    else:
        out[r, at + D_KV] = kv
    out[r, at + D_STATE] = b * (K[STATE] + max(2.0 * state_b / K[HBM_BPS], K[LIN_STEP]))
    out[r, at + D_TP] = tp_comm
    out[r, at + D_DCP_COMM] = dcp_comm
    out[r, at + D_DCP_FIXED] = dcp_fixed
    out[r, at + D_LAYER] = K[N_LAYERS]
    # the fused-MoE calls' floor in a step, one call per MoE layer: it does not depend on how
    # many experts the batch touches (``moe``) or on how the tokens route
    out[r, at + D_MOE_FIXED] = K[MOE_CALLS]
    out[r, at + D_SEQ] = b
    out[r, at + D_STEP] = 1.0


@njit(cache=True, inline="always")
def prefill_into(K, coll, b, L, s, warm, graph, out, r, at):
    """Write the ``PREFILL_TERMS`` of prefilling ``b`` prompts of ``L`` tokens, a share ``s`` of
    each cached, into ``out[r, at:at + N_PREFILL]``: the shared prefix is computed once, by the
    first prompt, unless ``warm`` (an earlier wave left it in the cache). Each chunk's dense GEMMs
    and routed experts are read- or compute-bound on their own. A pass the engine launches kernel by
    kernel pays the launch-bound fixed costs: per layer (``pf_fixed``) and per fused-MoE call
    (``pf_moe_fixed``); a pass of at most ``graph`` tokens replays a captured CUDA graph and pays
    neither (``engine_advisor.model.engines.base.Engine.prefill_graph_tokens``)."""
    first = 0.0 if warm else 1.0    # the prompt that computes the shared prefix
    new = max(L * (b * (1.0 - s) + first * s), 1.0)
    chunks = np.ceil(new / CHUNK_TOKENS)
    chunk = new / chunks
    out[r, at + P_GEMM] = chunks * max(chunk * K[MM], K[WEIGHTS_PASS])
    out[r, at + P_MOE] = chunks * max(chunk * K[MM_MOE],
                                      -K[W_EXPERTS] * math.expm1(chunk * K[LOG_Q_MISS]))
    # the full-attention layers' causal FLOPs: MLA's prefill path (its own kernels: the
    # latent's up-projection, the MHA-form attention over the chunk's context) or GQA / MHA's;
    # window-bounded and linear-attention layers are GQA-style kernels
    quad = K[ATTN_PF] * L * L * (first + (b - first) * (1.0 - s * s))
    linear = K[ATTN_PF_LINEAR] * new
    if K[IS_MLA] > 0.0:
        out[r, at + P_ATTN] = linear
        out[r, at + P_MLA] = quad
    else:
        out[r, at + P_ATTN] = quad + linear
        out[r, at + P_MLA] = 0.0
    # linear-attention layers' chunked kernels (KDA, GDN, Mamba2's SSD): per token
    out[r, at + P_LINEAR] = K[LIN_PF] * new
    out[r, at + P_COMM] = chunks * (2.0 * K[N_LAYERS]) * collective_s(chunk * K[ACT], coll, 0)
    eager = chunks if chunk > graph else 0.0     # passes launched kernel by kernel
    out[r, at + P_FIXED] = eager * K[N_LAYERS]
    # the fused-MoE path's fixed cost of one call: per MoE layer and eager forward pass
    out[r, at + P_MOE_FIXED] = eager * K[N_MOE_LAYERS]
    out[r, at + P_BATCH] = 1.0


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


# Columns of a prediction table (predict_rows): the figures, the memory (``memory_fit``'s
# facts from RUNNING on), then each decode term's seconds
(TOTAL, TOTAL_LO, TOTAL_HI, TTFT, PREFILL_ALL, TPOT, RUNNING, CAPACITY, FEASIBLE, T_FITS_ALL,
 T_BINDS, T_KNOB, T_KNOB_RUNNING, T_SLOTS, T_RUN0, T_CAP0, T_BINDS0) = range(17)
PARTS = 17
N_TABLE = PARTS + N_DECODE


@njit(cache=True)
def predict_rows(K, coll, curve, rows, coef, factors, noise, engine, rel_extra, z):
    """The prediction table (n, N_TABLE) of a case's rows: ``rows_into`` then
    ``predict_into``, in one call (one recommendation pays one dispatch)."""
    n = rows.shape[1]
    X = np.empty((n, 2 * N_TERMS))
    facts = np.empty((N_FACTS, n))
    rows_into(K, coll, curve, rows, X, facts)
    out = np.empty((n, N_TABLE))
    predict_into(X, coef, factors, noise, engine, rel_extra, z, out)
    for i in range(n):
        for k in range(N_FACTS):
            out[i, RUNNING + k] = facts[k, i]
    return out


# Columns of a query's evaluation (evaluate_rows): the figures a configuration's prediction
# reports, then each decode term's seconds
(E_TOTAL, E_LO, E_HI, E_PREFILL, E_DECODE, E_TPOT, E_RUNNING, E_CAPACITY, E_FITS, E_FEASIBLE,
 E_DOUBLINGS, E_BINDS, E_KNOB, E_KNOB_RUNNING, E_SLOTS, E_RUN0, E_CAP0, E_BINDS0) = range(18)
E_PARTS = 18
N_EVAL = E_PARTS + N_DECODE
MAX_TOKENS = 2.0 ** 62     # a capacity reported beyond this is reported as this


@njit(cache=True)
def evaluate_rows(K, coll, curve, static, batch, context, output, share, coef,
                  factors, noise, engine, sigma, bounds, per_doubling, z):
    """One query's configurations at its sizes
    (``engine_advisor.model.predict.query.Query.evaluate``), in one call: ``static`` (N_ROW_FIELDS,
    n) the rows without sizes (``static_rows``), ``share`` each row's cached prompt share; ``sigma``
    each row's added relative sd by calibration status, plus ``per_doubling`` per doubling of the
    sizes outside its calibrated range, ``bounds`` (n, 6): low and high of (context, batch, output)
    (0 and inf without a range). Returns (n, N_EVAL): total, its interval, all prefill, decode
    (total less prefill), TPOT, sequences at once (0 when none fits), KV capacity (at most
    MAX_TOKENS), whether the whole batch's KV fits, whether one sequence fits, doublings outside the
    calibrated range; then the decode step's terms."""
    n = static.shape[1]
    rows = static.copy()
    extra = np.empty(n)
    dists = np.empty(n)
    for i in range(n):
        rows[2, i] = batch
        rows[3, i] = context
        rows[4, i] = output
        rows[6, i] = share[i]
        dist = 0.0
        for k, v in enumerate((context, batch, output)):
            lo, hi = bounds[i, 2 * k], bounds[i, 2 * k + 1]
            if v > hi:
                dist += math.log2(v / hi)
            elif v < lo:
                dist += math.log2(lo / v)
        dists[i] = dist
        extra[i] = sigma[i] + per_doubling * dist
    t = predict_rows(K, coll, curve, rows, coef, factors, noise, engine, extra, z)
    out = np.empty((n, N_EVAL))
    for i in range(n):
        total, pf = t[i, TOTAL], t[i, PREFILL_ALL]
        ok = t[i, FEASIBLE] > 0.0
        cap = t[i, CAPACITY]
        out[i, E_TOTAL] = total
        out[i, E_LO] = t[i, TOTAL_LO]
        out[i, E_HI] = t[i, TOTAL_HI]
        out[i, E_PREFILL] = pf
        out[i, E_DECODE] = total - pf if total > pf else 0.0
        out[i, E_TPOT] = t[i, TPOT]
        out[i, E_RUNNING] = t[i, RUNNING] if ok else 0.0
        out[i, E_CAPACITY] = cap if cap < MAX_TOKENS else MAX_TOKENS
        out[i, E_FITS] = t[i, T_FITS_ALL]
        out[i, E_FEASIBLE] = 1.0 if ok else 0.0
        out[i, E_DOUBLINGS] = dists[i]
        out[i, E_BINDS] = t[i, T_BINDS]
        out[i, E_KNOB] = t[i, T_KNOB]
        out[i, E_KNOB_RUNNING] = t[i, T_KNOB_RUNNING]
        out[i, E_SLOTS] = t[i, T_SLOTS]
        out[i, E_RUN0] = t[i, T_RUN0] if ok else 0.0
        out[i, E_CAP0] = min(t[i, T_CAP0], MAX_TOKENS)
        out[i, E_BINDS0] = t[i, T_BINDS0]
        for j in range(N_DECODE):
            out[i, E_PARTS + j] = t[i, PARTS + j]
    return out


@njit(cache=True)
def predict_into(X, coef, factors, noise, engine, rel_extra, z, out):
    """Each row's prediction from its features ``X`` (``rows_into``) and its engine's fitted
    efficiencies: ``coef`` (engines, 2 x N_TERMS) the coefficients of X's columns, ``factors``
    (engines, N_TERMS, rank) with the coefficients' covariance = F F', ``noise`` (engines,) the
    relative residual sd, ``engine`` each row's index into them, ``rel_extra`` each row's added
    relative sd. Writes into ``out`` (n, N_TABLE) columns TOTAL ... TPOT: total, its ``z``-sd
    interval (low, high), the first wave's prefill (TTFT), all waves' prefill, one decode
    step; and from PARTS on the seconds of each term of that step."""
    rank = factors.shape[2]
    for i in range(X.shape[0]):
        e = engine[i]
        total = 0.0
        prefill_all = 0.0
        for j in range(N_TERMS):
            v = X[i, j] * coef[e, j]
            total += v
            if j < N_PREFILL:
                prefill_all += v
        ttft = 0.0
        for j in range(N_PREFILL):
            ttft += X[i, FIRST_PREFILL + j] * coef[e, FIRST_PREFILL + j]
        tpot = 0.0
        for j in range(N_DECODE):
            v = X[i, STEP + j] * coef[e, STEP + j]
            out[i, PARTS + j] = v
            tpot += v
        var = 0.0           # parameter variance x' cov x = |x' F|^2
        for r in range(rank):
            q = 0.0
            for j in range(N_TERMS):
                q += X[i, j] * factors[e, j, r]
            var += q * q
        rel = noise[e] + rel_extra[i]
        sd = math.sqrt(max(var, 0.0) + (rel * total) ** 2)
        out[i, TOTAL] = total
        out[i, TOTAL_LO] = max(total - z * sd, 0.0)
        out[i, TOTAL_HI] = total + z * sd
        out[i, TTFT] = ttft
        out[i, PREFILL_ALL] = prefill_all
        out[i, TPOT] = tpot
