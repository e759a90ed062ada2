"""Physical terms of prefill and decode, in seconds on one GPU of a tensor-parallel group.

Every term is a named feature: the time one part of the work takes on the silicon at its
achievable rate (``model.silicon``), or a count (layers, sequences, forward passes) for the
engines' fixed costs. An engine's time is ``sum(coef[t] * feature[t])`` with non-negative
coefficients fitted per engine (``model.estimator``): physics terms start at coefficient 1
(the silicon's achievable rate), count terms at a prior cost per unit.

Decode step of ``B`` sequences at context ``c`` on ``tp`` GPUs with DCP ``d``:

- ``gemm``: max(weight bytes the batch touches / tp / weight-read bandwidth,
  2 x active params x B / tp / GEMM FLOP/s) -- dense layers, shared experts and the expected
  routed experts ``E (1 - (1 - k/E)^B)`` per MoE layer;
- ``kv_read``: per full-attention layer one attention call reading ``B c kv_layer / shards / d``
  bytes (the silicon's per-call read curve), or its FLOPs if those take longer;
- ``state``: linear-attention state read and written per sequence;
- ``tp_comm``: two all-reduces of ``B x hidden`` activations per layer;
- ``dcp_comm``: per full-attention layer, gathering the queries and combining partial outputs
  (+ log-sum-exp) across the ``d`` DCP ranks;
- ``layer_fixed`` (count: layers), ``seq_fixed`` (count: sequences), ``step_fixed`` (1).

Prefill of ``B`` prompts of ``L`` tokens, a share ``s`` of each found in the prefix cache
(the shared part computed once), in chunks of ``CHUNK_TOKENS``:

- ``pf_gemm``: per chunk max(chunk FLOPs / GEMM FLOP/s, weights / tp / bandwidth);
- ``pf_attn``: causal attention FLOPs ``coef L^2 (1 + (B - 1)(1 - s^2))`` / tp / attention FLOP/s;
- ``pf_comm``: two all-reduces of the chunk's activations per layer and chunk;
- ``pf_fixed`` (count: layers x forward passes);
- ``pf_batch`` (count: 1 per prefilled batch: scheduling, tokenisation, first sampling).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.shape import ModelShape
from model.silicon import Silicon

PREFILL_TERMS = ("pf_gemm", "pf_attn", "pf_comm", "pf_fixed", "pf_batch")
DECODE_TERMS = ("gemm", "kv_read", "state", "tp_comm", "dcp_comm", "layer_fixed", "seq_fixed",
                "step_fixed")
TERMS = PREFILL_TERMS + DECODE_TERMS
N_PREFILL = len(PREFILL_TERMS)
PHYSICS_TERMS = ("pf_gemm", "pf_attn", "pf_comm", "gemm", "kv_read", "state", "tp_comm",
                 "dcp_comm")
CHUNK_TOKENS = 8192          # chunked-prefill budget per forward pass (both engines' default)
ACT_BYTES = 2                # bf16 activations on the wire
LSE_BYTES = 4                # one fp32 log-sum-exp per head and sequence


@dataclass(frozen=True)
class Hardware:
    """The silicon and the parallel layout one prediction runs on."""

    silicon: Silicon
    tp: int


def decode_terms(shape: ModelShape, hw: Hardware, batch, context, dcp) -> np.ndarray:
    """Features (n, len(DECODE_TERMS)) of one decode step; arrays broadcast together."""
    si, tp = hw.silicon, float(hw.tp)
    b, c, d = np.broadcast_arrays(np.asarray(batch, dtype=float),
                                  np.asarray(context, dtype=float),
                                  np.maximum(np.asarray(dcp, dtype=float), 1.0))
    out = np.zeros(b.shape + (len(DECODE_TERMS),))
    weights = shape.step_weight_bytes(b) / tp / si.weight_read_Bps
    flops = b * matmul_seconds_per_token(shape, si) / tp
    out[..., 0] = np.maximum(weights, flops)
    if shape.n_full_layers:
        per_call = b * c * shape.kv_layer_bytes / shape.shards(hw.tp) / d
        read = si.attn_read_s(_family(shape), shape.kv_dtype, per_call)
        attn = (b * c * shape.attn_flops_per_ctx_token / shape.n_full_layers / tp / d
                / si.attn_flops)
        out[..., 1] = shape.n_full_layers * np.maximum(read, attn)
    out[..., 2] = 2.0 * b * shape.state_bytes_per_seq / tp / si.gpu.hbm_bandwidth
    out[..., 3] = 2.0 * shape.n_layers * si.all_reduce_s(b * shape.hidden_size * ACT_BYTES, tp)
    out[..., 4] = shape.n_full_layers * dcp_combine_layer_s(shape, si, hw.tp, b, d)
    out[..., 5] = shape.n_layers
    out[..., 6] = b
    out[..., 7] = 1.0
    return out


def dcp_combine_layer_s(shape: ModelShape, si: Silicon, tp: int, batch, dcp) -> np.ndarray:
    """Seconds DCP's collectives add to one full-attention layer: all-gather the queries of
    the group's heads, then gather the partial outputs and log-sum-exps to combine them."""
    heads = max(shape.q_heads, 1) / tp * dcp  # heads each rank attends for after the gather
    q_bytes = batch * heads * shape.qk_dim * ACT_BYTES
    o_bytes = batch * heads * (shape.v_dim * ACT_BYTES + LSE_BYTES)
    return np.where(dcp > 1, si.all_gather_s(q_bytes, dcp) + si.all_gather_s(o_bytes, dcp), 0.0)


def prefill_terms(shape: ModelShape, hw: Hardware, batch, context, share=0.0,
                  warm: bool = False) -> np.ndarray:
    """Features (n, len(PREFILL_TERMS)) of prefilling ``batch`` prompts of ``context`` tokens,
    a share ``share`` of each cached: the shared prefix is computed once, by the first prompt,
    unless ``warm`` (an earlier wave left it in the cache)."""
    si, tp = hw.silicon, float(hw.tp)
    b, L, s = np.broadcast_arrays(np.asarray(batch, dtype=float),
                                  np.asarray(context, dtype=float),
                                  np.asarray(share, dtype=float))
    first = 0.0 if warm else 1.0    # the prompt that computes the shared prefix
    new = L * (b * (1.0 - s) + first * s)
    new = np.maximum(new, 1.0)
    chunks = np.ceil(new / CHUNK_TOKENS)
    chunk = new / chunks
    out = np.zeros(b.shape + (len(PREFILL_TERMS),))
    chunk_flops = chunk * matmul_seconds_per_token(shape, si) / tp
    chunk_weights = shape.weight_bytes / tp / si.weight_read_Bps
    out[..., 0] = chunks * np.maximum(chunk_flops, chunk_weights)
    attn = (shape.attn_prefill_coef * L ** 2 * (first + (b - first) * (1.0 - s ** 2))
            + shape.attn_prefill_linear * new)
    out[..., 1] = attn / tp / si.attn_flops
    out[..., 2] = chunks * 2.0 * shape.n_layers * si.all_reduce_s(
        chunk * shape.hidden_size * ACT_BYTES, tp)
    out[..., 3] = chunks * shape.n_layers
    out[..., 4] = 1.0
    return out


def matmul_seconds_per_token(shape: ModelShape, si: Silicon) -> float:
    """Seconds of one token's matmuls on one GPU (before dividing by tp): the FLOPs of each
    compute dtype at that dtype's achievable rate."""
    return sum(f / si.gemm_flops(dtype) for dtype, f in shape.matmul_flops)


def _family(shape: ModelShape) -> str:
    return "gqa" if shape.attention in ("gqa", "mha") else "mla"
