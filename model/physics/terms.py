"""Physical terms of prefill and decode, in seconds on one GPU of a tensor-parallel group.

Every term is a named feature: the time one part of the work takes on the silicon at its achievable
rate (``engine_advisor.model.hardware.silicon``), or a count (layers, sequences, forward passes) for
the engines' fixed costs. An engine's time is ``sum(coef[t] * feature[t])`` with non-negative
coefficients fitted per engine (``engine_advisor.model.fit.estimator``): physics terms start at
coefficient 1 (the silicon's achievable rate), count terms at a prior cost per unit.

Decode step of ``B`` sequences at context ``c`` on ``tp`` GPUs with DCP ``d``:

- ``gemm``: max(weight bytes the batch touches / tp / weight-read bandwidth,
  2 x active params x B / tp / GEMM FLOP/s) -- dense layers, shared experts and the expected
  routed experts ``E (1 - (1 - k/E)^B)`` per MoE layer;
- ``kv_read``: per full-attention layer one attention call reading ``B c kv_layer / shards / d``
  bytes (the silicon's per-call read curve), or its FLOPs if those take longer;
- ``state``: each sequence's linear-attention state read and written back (at its engine's
  dtypes), or its recurrent update's FLOPs if those take longer, and a sliding window's KV;
- ``tp_comm``: two all-reduces of ``B x hidden`` activations per layer;
- ``dcp_comm``: per full-attention layer, gathering the queries and combining partial outputs
  (+ log-sum-exp) across the ``d`` DCP ranks;
- ``kernel_fixed`` (count: the kernels the engine launches in the step, one for each, at the
  launch-and-tail cost of a kernel in a CUDA-graph replay: its feature is 1 and the
  engine's count for the model, ``engine_advisor.model.physics.launches``, scales it in
  ``engine_advisor.model.physics.scale``), ``seq_fixed`` (count: sequences),
  ``step_fixed`` (1);
- ``moe_fixed``: one fused-MoE call per MoE layer at the silicon's measured floor, what the
  call costs whatever the experts' bytes (``engine_advisor.model.hardware.silicon.MOE_CALL_S``:
  sorting the tokens by expert, the grouped GEMMs' launches and tails); its coefficient carries the
  engine's routing kernels and kernel configuration.

Prefill of ``B`` prompts of ``L`` tokens, a share ``s`` of each found in the prefix cache
(the shared part computed once), in chunks of ``CHUNK_TOKENS``:

- ``pf_gemm``: per chunk max(chunk FLOPs / GEMM FLOP/s, weights / tp / bandwidth);
- ``pf_attn``: causal attention FLOPs ``coef L^2 (1 + (B - 1)(1 - s^2))`` / tp / attention FLOP/s
  of GQA / MHA layers, and of window-bounded and linear-attention layers (``x L``);
- ``pf_mla``: the same FLOPs of MLA's full-attention layers: the engines prefill MLA on kernels
  of its own (the latent up-projected per chunk, MHA-form attention), as ``mla_read`` decodes it;
- ``pf_linear``: linear-attention layers' chunked delta-rule kernels (KDA, GDN): per prompt
  token their FLOPs at the attention rate and the chunk states and inputs they stream through HBM
  (``engine_advisor.model.arch.Architecture.linear_prefill_flops_per_token``,
  ``..._bytes_per_token``), one after the other as the kernels run;
- ``pf_ssd``: the same physics of Mamba2's layers, whose chunked kernels (the SSD's chunk
  state, state passing and chunk scan) are another family: an engine's kernels of one family run
  at an efficiency of their own (``engine_advisor.model.engines.base.Engine.kernel_priors``);
- ``pf_comm``: two all-reduces of the chunk's activations per layer and chunk;
- ``pf_fixed`` (count: layers x forward passes the engine launches kernel by kernel; a pass it
  replays as a captured CUDA graph has none:
  ``engine_advisor.model.engines.base.Engine.graphed_prefill_tokens``);
- ``pf_moe_fixed`` (count: MoE layers x those passes: the fused-MoE path's fixed cost per
  call: routing, token permutation into expert order and back, the grouped GEMMs' launches);
- ``pf_batch`` (count: 1 per prefilled batch: scheduling, tokenisation, first sampling).

The formulas are compiled by numba (``engine_advisor.model.formulas.terms``: ``decode_into``,
``prefill_into`` and the rows of ``engine_advisor.model.physics.features.case_features`` that call
them): one recommendation evaluates its rows in microseconds and a grid of 80,000 rows in
milliseconds, with no second implementation. ``Physics`` packs one model's constants on one GPU and
TP size into the arrays they read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine_advisor.model.formulas.layout import (
    ACT,
    ACT_PEAK,
    ACT_SEQ,
    ATTN_CALL,
    ATTN_PF,
    ATTN_PF_LINEAR,
    DECODE_TERMS,
    HBM_BPS,
    IS_MLA,
    IS_SSD,
    KV_CALL,
    KV_GPU_TOKEN,
    LIN_PF,
    LIN_STEP,
    LOG_Q_MISS,
    MAX_LEN,
    MEMORY,
    MM,
    MM_MOE,
    MOE_CALLS,
    N_CONSTANTS,
    N_DECODE,
    N_FULL,
    N_LAYERS,
    N_MOE_LAYERS,
    N_PREFILL,
    O_GATHER,
    PREFILL_TERMS,
    Q_GATHER,
    READ_ASYM,
    READ_BPS,
    READ_T0,
    STATE,
    TP,
    W_DENSE,
    W_EXPERTS,
    WEIGHT_BYTES,
    WEIGHTS_PASS,
    WINDOW_GPU,
)
from engine_advisor.model.formulas.terms import batch_terms, decode_into, prefill_into
from engine_advisor.model.hardware.silicon import Silicon
from engine_advisor.model.physics.memory import activation_pass_bytes, sampler_row_bytes
from engine_advisor.model.physics.shape import ModelShape

TERMS = PREFILL_TERMS + DECODE_TERMS
PHYSICS_TERMS = ("pf_gemm", "pf_moe", "pf_attn", "pf_mla", "pf_linear", "pf_ssd", "pf_comm", "gemm",
                 "moe", "kv_read", "mla_read", "dcp_read", "state", "tp_comm", "dcp_comm",
                 "moe_fixed")
ACT_BYTES = 2                # bf16 activations on the wire
LSE_BYTES = 4                # one fp32 log-sum-exp per head and sequence


@dataclass(frozen=True)
class Hardware:
    """The silicon and the parallel layout one prediction runs on."""

    silicon: Silicon
    tp: int


class Physics:
    """The constants of one served model on one GPU type and TP size, computed once
    (``physics_for``) and packed for the compiled formulas:

    - ``K``: the scalars, a tuple (positions ``W_DENSE`` ... ``READ_BPS``);
    - ``curve``: the silicon's per-call KV read curves
      (``engine_advisor.model.hardware.profiles.ReadCurve.
      table``), one per DCP size (``dcp_read_levels``: level ``d`` at ``d x`` the heads per
      rank);
    - ``collectives(d)``: rows of ``engine_advisor.model.hardware.silicon.Collective.params``: row 0
      the TP
      all-reduce, row ``k`` the all-gather over ``k`` DCP ranks.
    """

    def __init__(self, shape: ModelShape, si: Silicon, tp: int):
        t = float(tp)
        self.shape, self.silicon, self.tp = shape, si, tp
        self.family = "gqa" if shape.attention in ("gqa", "mha") else "mla"
        read = si.read_curve(self.family, shape.kv_dtype)
        # where the read curve came from: a measured table's name, or "spec"
        self.read_source = si.read_source(self.family, shape.kv_dtype)
        heads = max(shape.q_heads, 1) / t        # per rank, times dcp after the gather
        self.curve = dcp_read_levels(si, self.family, shape.kv_dtype, read.table, heads, tp)
        K = np.zeros(N_CONSTANTS)
        # gemm: the dense weights or their FLOPs; moe: E (1 - q^B) routed experts per MoE
        # layer, or their FLOPs
        # each part's bytes at its own format's measured weight-read rate
        K[W_DENSE] = shape.dense_step_bytes / t / dense_read_Bps(shape, si)
        miss = 1.0 - shape.experts_per_token / shape.n_experts if shape.n_experts else 1.0
        K[LOG_Q_MISS] = math.log(miss) if miss > 0 else -math.inf
        expert_dtype = (shape.summary.get("part_dtypes") or {}).get("routed_experts", "bf16")
        K[W_EXPERTS] = (shape.n_moe_layers * shape.n_experts * shape.expert_bytes / t
                        / si.weight_read_for(expert_dtype))
        dense, moe = shape.dense_and_moe_flops
        K[MM] = si.matmul_s_per_token(dense) / t
        K[MM_MOE] = si.matmul_s_per_token(moe) / t
        K[IS_MLA] = 1.0 if shape.attention == "mla" else 0.0   # a bare shape: kv_read
        # kv_read: one call per full-attention layer on the read curve, or its FLOPs
        K[N_FULL] = shape.n_full_layers
        K[KV_CALL] = shape.kv_layer_bytes / shape.shards(tp)
        K[ATTN_CALL] = (shape.attn_flops_per_ctx_token / shape.n_full_layers / t
                        / si.attn_flops) if shape.n_full_layers else 0.0
        # state: a sliding window's KV read per sequence; the linear-attention state per
        # sequence is the engine's (its dtypes: a row field), streamed at HBM_BPS, or the
        # recurrent update's FLOPs (LIN_STEP)
        K[HBM_BPS] = si.stream_Bps
        K[STATE] = shape.window_bytes_per_seq / t / si.stream_Bps
        K[LIN_STEP] = shape.linear_step_flops / t / si.attn_flops
        K[LIN_PF] = (shape.linear_prefill_flops / si.attn_flops
                     + shape.linear_prefill_bytes / si.stream_Bps) / t
        K[IS_SSD] = 1.0 if shape.linear_kind == "mamba2" else 0.0     # pf_ssd, not pf_linear
        K[N_LAYERS] = shape.layer_units
        K[N_MOE_LAYERS] = shape.n_moe_layers if shape.n_experts else 0
        K[MOE_CALLS] = K[N_MOE_LAYERS] * si.moe_call_s(expert_dtype, shape.n_experts)
        K[ACT] = shape.hidden_size * ACT_BYTES
        K[Q_GATHER] = heads * shape.qk_dim * ACT_BYTES
        K[O_GATHER] = heads * (shape.v_dim * ACT_BYTES + LSE_BYTES)
        # prefill
        K[WEIGHTS_PASS] = K[W_DENSE]      # a prefill pass reads the dense weights once
        K[ATTN_PF] = shape.attn_prefill_coef / (t * si.attn_flops)
        K[ATTN_PF_LINEAR] = shape.attn_prefill_linear / (t * si.attn_flops)
        # capacity (engine_advisor.model.physics.memory.kv_capacity)
        K[MEMORY] = si.gpu.memory_bytes
        K[WEIGHT_BYTES] = shape.weight_bytes
        K[TP] = t
        K[KV_GPU_TOKEN] = shape.kv_gpu_token_bytes(tp)
        K[WINDOW_GPU] = shape.window_bytes_per_seq / t
        K[MAX_LEN] = float(shape.max_context or 0) or 131072.0
        K[READ_T0], K[READ_ASYM], K[READ_BPS] = read.t0, read.asym, read.bps
        K[ACT_PEAK] = activation_pass_bytes(shape.summary, tp)
        K[ACT_SEQ] = sampler_row_bytes(shape.summary)
        self.K = tuple(K.tolist())    # a tuple: the compiled code reads it without reference counts
        # the collective table: row 0 the TP all-reduce, row k the all-gather over k DCP ranks
        # (``collectives`` grows it; ``len(coll) - 1`` is the largest DCP size it covers)
        self.coll = np.array([si.collective("all_reduce", t).params])

    def collectives(self, max_dcp: float) -> np.ndarray:
        """The collective table covering DCP sizes up to ``max_dcp`` (grown on demand)."""
        have = len(self.coll) - 1
        if max_dcp > have:
            rows = [self.silicon.collective("all_gather", float(k)).params
                    for k in range(have + 1, int(max_dcp) + 1)]
            self.coll = np.concatenate([self.coll, np.array(rows)])
        return self.coll

    def decode(self, b: float, c: float, d: float, state_bytes: float | None = None
               ) -> tuple[float, ...]:
        """The ``DECODE_TERMS`` of one step of ``b`` sequences at context ``c``, DCP ``d``, each
        holding ``state_bytes`` of linear-attention state per GPU (default: the model's at
        float32 recurrent state, ``ModelShape.state_bytes_per_seq`` less its window)."""
        if state_bytes is None:
            state_bytes = (self.shape.state_bytes_per_seq - self.shape.window_bytes_per_seq) \
                / self.tp
        out = np.empty((1, N_DECODE))
        gemm, moe, tp_comm = batch_terms(self.K, self.coll, float(b))
        decode_into(self.K, self.collectives(d), self.curve, float(b), float(c), float(d),
                    gemm, moe, tp_comm, float(state_bytes), out, 0, 0)
        return tuple(out[0].tolist())

    def prefill(self, b: float, L: float, s: float = 0.0, warm: bool = False,
                graph_tokens: float = 0.0) -> tuple[float, ...]:
        """The ``PREFILL_TERMS`` of prefilling ``b`` prompts of ``L`` tokens, a share ``s``
        of each cached, passes of up to ``graph_tokens`` replayed as CUDA graphs
        (``prefill_into``; ``engine_advisor.model.engines.base.Engine.graphed_prefill_tokens``)."""
        out = np.empty((1, N_PREFILL))
        prefill_into(self.K, self.coll, float(b), float(L), float(s), bool(warm),
                     float(graph_tokens), out, 0, 0)
        return tuple(out[0].tolist())


def dcp_read_levels(si: Silicon, family: str, dtype: str, table: np.ndarray, heads: float,
                    tp: int) -> np.ndarray:
    """The read curves a decode step looks up, stacked (levels, 4, knots): level ``d`` is
    the call of one rank under DCP ``d``, which runs ``d x heads`` query heads (the gathered
    queries of the group) over ``1 / d`` of the context. Its seconds are the base curve's
    (``table``, the call at ``heads`` per rank) times the measured slowdown of ``d x heads``
    over ``heads`` at the same bytes (``Silicon.heads_ratio``: the engine-kernel tables
    measure 64-128 heads per call reading 15-25 % slower than 8-16); above the last knot a
    level grows at the base curve's asymptotic bandwidth. Levels 0 and 1 are the base curve;
    one level only when the profile measured no head counts (then heads do not matter)."""
    levels = [table, table]
    if table.shape[1] >= 2:
        for d in range(2, tp + 1):
            ratio = si.heads_ratio(family, dtype, heads, heads * d, table[0])
            if ratio is None:
                break
            sec = table[1] * ratio
            for i in range(1, len(sec)):        # strictly increasing, as read_s needs
                sec[i] = max(sec[i], sec[i - 1] * (1.0 + 1e-9))
            levels.append(np.stack([table[0], sec, table[2], np.log(sec)]))
    if len(levels) == 2:
        levels = [table]
    return np.ascontiguousarray(np.stack(levels))


DENSE_PARTS = ("attention", "linear_attention", "dense_mlp", "shared_experts", "lm_head", "other")


def dense_read_Bps(shape: ModelShape, si: Silicon) -> float:
    """The rate a decode step streams the dense weights at: each dense part's bytes at its
    format's measured rate (``Silicon.weight_read_for``), as one bytes-weighted rate."""
    parts = shape.summary.get("weight_bytes_by_part") or {}
    dtypes = shape.summary.get("part_dtypes") or {}
    total = sum(parts.get(p, 0.0) for p in DENSE_PARTS)
    if total <= 0:
        return si.weight_read_Bps
    seconds = sum(parts.get(p, 0.0) / si.weight_read_for(dtypes.get(p, "bf16"))
                  for p in DENSE_PARTS)
    return total / seconds


def physics_for(shape: ModelShape, si: Silicon, tp: int) -> Physics:
    """The ``Physics`` of a model on a GPU type and TP size (kept with the shape)."""
    key = (si, tp)
    hit = shape.physics.get(key)
    if hit is None:
        if len(shape.physics) >= 64:    # silicon objects replaced (profiles reloaded)
            shape.physics.clear()
        hit = shape.physics[key] = Physics(shape, si, tp)
    return hit


def decode_terms(shape: ModelShape, hw: Hardware, batch: float, context: float,
                 dcp: float, state_bytes: float | None = None) -> tuple[float, ...]:
    """The ``DECODE_TERMS`` of one decode step, in that order (``Physics.decode``)."""
    return physics_for(shape, hw.silicon, hw.tp).decode(batch, context, dcp, state_bytes)


def prefill_terms(shape: ModelShape, hw: Hardware, batch: float, context: float,
                  share: float = 0.0, warm: bool = False,
                  graph_tokens: float = 0.0) -> tuple[float, ...]:
    """The ``PREFILL_TERMS`` of a prefill (``Physics.prefill``)."""
    return physics_for(shape, hw.silicon, hw.tp).prefill(batch, context, share, warm,
                                                         graph_tokens)
