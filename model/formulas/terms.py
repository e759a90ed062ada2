"""The cost terms, in seconds at unit efficiency: a decode step's (``batch_terms``, the
context-free ones, and ``decode_into``) and a prefill's (``prefill_into``);
``engine_advisor.model.physics.terms`` documents them."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from engine_advisor.model.formulas.hardware import collective_s, read_s
from engine_advisor.model.formulas.layout import (
    ACT,
    ATTN_CALL,
    ATTN_PF,
    ATTN_PF_LINEAR,
    D_DCP_COMM,
    D_DCP_FIXED,
    D_DCP_READ,
    D_GEMM,
    D_KERNELS,
    D_KV,
    D_MLA,
    D_MOE,
    D_MOE_FIXED,
    D_SEQ,
    D_STATE,
    D_STEP,
    D_TP,
    HBM_BPS,
    IS_MLA,
    IS_SSD,
    KV_CALL,
    LIN_PF,
    LIN_STEP,
    LOG_Q_MISS,
    MM,
    MM_MOE,
    MOE_CALLS,
    N_DECODE,
    N_FULL,
    N_LAYERS,
    N_MOE_LAYERS,
    O_GATHER,
    P_ATTN,
    P_BATCH,
    P_COMM,
    P_FIXED,
    P_GEMM,
    P_LINEAR,
    P_MLA,
    P_MOE,
    P_MOE_FIXED,
    P_SSD,
    Q_GATHER,
    READ_ASYM,
    READ_BPS,
    READ_T0,
    STATE,
    W_DENSE,
    W_EXPERTS,
    WEIGHTS_PASS,
)

CHUNK_TOKENS = 8192          # chunked-prefill budget per forward pass (both engines' default)


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
    # the step's kernels, one each: the engine's count for the model multiplies the term's
    # coefficient (engine_advisor.model.physics.scale)
    out[r, at + D_KERNELS] = 1.0
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
    # linear-attention layers' chunked kernels, per token: the delta rule's (KDA, GDN) or
    # Mamba2's SSD, each engine's kernels of a family on their own term
    out[r, at + P_LINEAR] = 0.0 if K[IS_SSD] > 0.0 else K[LIN_PF] * new
    out[r, at + P_SSD] = K[LIN_PF] * new if K[IS_SSD] > 0.0 else 0.0
    out[r, at + P_COMM] = chunks * (2.0 * K[N_LAYERS]) * collective_s(chunk * K[ACT], coll, 0)
    eager = chunks if chunk > graph else 0.0     # passes launched kernel by kernel
    out[r, at + P_FIXED] = eager * K[N_LAYERS]
    # the fused-MoE path's fixed cost of one call: per MoE layer and eager forward pass
    out[r, at + P_MOE_FIXED] = eager * K[N_MOE_LAYERS]
    out[r, at + P_BATCH] = 1.0
