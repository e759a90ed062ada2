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

from model.ew import ceil, distinct, maximum
from model.memory import kv_capacity, max_running
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


class Physics:
    """The terms of one served model on one GPU type and TP size: every constant the formulas
    need, computed once (``physics_for``), then ``decode`` and ``prefill`` evaluate rows given
    as floats or as numpy arrays (``model.ew``)."""

    def __init__(self, shape: ModelShape, si: Silicon, tp: int):
        t = float(tp)
        wr = si.weight_read_Bps
        self.shape, self.silicon, self.tp = shape, si, tp
        # gemm: dense weights + E (1 - q^B) routed experts per MoE layer, or FLOPs
        self.w_dense = shape.dense_step_bytes / t / wr
        self.q = 1.0 - shape.experts_per_token / shape.n_experts if shape.n_experts else 1.0
        self.w_experts = (shape.n_moe_layers * shape.n_experts * shape.expert_bytes / t / wr)
        self.mm = si.matmul_s_per_token(shape.matmul_flops) / t
        # kv_read: one call per full-attention layer on the read curve, or its FLOPs
        self.n_full = float(shape.n_full_layers)
        self.kv_call = shape.kv_layer_bytes / shape.shards(tp)
        self.attn_call = (shape.attn_flops_per_ctx_token / shape.n_full_layers / t
                          / si.attn_flops) if shape.n_full_layers else 0.0
        self.family = "gqa" if shape.attention in ("gqa", "mha") else "mla"
        self.read = si.read_curve(self.family, shape.kv_dtype)   # bytes -> seconds per call
        self.state = 2.0 * shape.state_bytes_per_seq / t / si.gpu.hbm_bandwidth
        self.n_layers = float(shape.n_layers)
        self.act_bytes = shape.hidden_size * ACT_BYTES
        self.tp_ar = si.collective("all_reduce", t)
        heads = max(shape.q_heads, 1) / t        # per rank, times dcp after the gather
        self.q_gather = heads * shape.qk_dim * ACT_BYTES
        self.o_gather = heads * (shape.v_dim * ACT_BYTES + LSE_BYTES)
        # prefill
        self.weights_pass = shape.weight_bytes / t / wr
        self.attn_pf = shape.attn_prefill_coef / (t * si.attn_flops)
        self.attn_pf_linear = shape.attn_prefill_linear / (t * si.attn_flops)
        self._memo: dict = {}
        self._gathers: dict = {}
        self._batch_terms: dict = {}
        self._capacity: dict = {}
        self.memory = si.gpu.memory_bytes
        self.kv_gpu_token = shape.kv_gpu_token_bytes(tp)
        self.state_gpu = shape.state_bytes_per_seq / t

    def capacity(self, engine, fraction, dcp, batch):
        """KV tokens one instance holds (``model.memory.kv_capacity``; memoised for floats):
        its budget after weights, the engine's reserve and the state pool of the running-
        sequence limit the batch sets."""
        key = (engine, fraction, dcp, batch)
        try:
            return self._capacity[key]
        except KeyError:      # floats not seen yet
            pass
        except TypeError:     # arrays (unhashable): not memoised
            key = None
        cap = kv_capacity(engine, fraction, self.memory, self.shape.weight_bytes, self.tp,
                          self.kv_gpu_token, dcp, self.state_gpu * max_running(batch))
        if key is not None:
            if len(self._capacity) >= MEMO_SIZE:
                self._capacity.clear()
            self._capacity[key] = cap
        return cap

    def decode(self, b, c, d) -> tuple:
        """The ``DECODE_TERMS`` of one step of ``b`` sequences at context ``c``, DCP ``d``."""
        d = maximum(d, 1.0)
        if isinstance(b, np.ndarray) or isinstance(d, np.ndarray):
            gemm, state, tp_comm, dcp_comm = self.batch_terms(b, d)
        else:   # memoised: they do not depend on the context
            key = (b, d)
            hit = self._batch_terms.get(key)
            if hit is None:
                if len(self._batch_terms) >= MEMO_SIZE:
                    self._batch_terms.clear()
                hit = self._batch_terms[key] = self.batch_terms(b, d)
            gemm, state, tp_comm, dcp_comm = hit
        kv = 0.0 * b
        if self.n_full:
            ctx = b * c / d
            kv = self.n_full * maximum(self.read(ctx * self.kv_call), ctx * self.attn_call)
        return (gemm, kv, state, tp_comm, dcp_comm, self.n_layers, b, 1.0)

    def batch_terms(self, b, d) -> tuple:
        """(gemm, state, tp_comm, dcp_comm) of a decode step of ``b`` sequences, DCP ``d``."""
        gemm = maximum(self.w_dense + self.w_experts * (1.0 - self.q ** b), b * self.mm)
        tp_comm = 2.0 * self.n_layers * self.tp_ar(b * self.act_bytes)
        return gemm, b * self.state, tp_comm, self.dcp_comm(b, d)

    def dcp_comm(self, b, d):
        """Per full-attention layer, DCP's collectives: all-gather the queries of the group's
        heads, then gather the partial outputs and log-sum-exps to combine them."""
        if not self.n_full:
            return 0.0 * b * d
        if not isinstance(d, np.ndarray):
            if d <= 1:
                return 0.0 * b
            ag = self._gathers.get(d)
            if ag is None:
                ag = self._gathers[d] = self.silicon.collective("all_gather", float(d))
            return self.n_full * (ag(b * d * self.q_gather) + ag(b * d * self.o_gather))
        b, d = np.broadcast_arrays(np.asarray(b, dtype=float), d)
        out = np.zeros(d.shape)
        for size in distinct(d):
            if size > 1:
                rows = d == size
                out[rows] = self.dcp_comm(b[rows], size)
        return out

    def prefill(self, b, L, s=0.0, warm: bool = False) -> tuple:
        """The ``PREFILL_TERMS`` of prefilling ``b`` prompts of ``L`` tokens, a share ``s`` of
        each cached: the shared prefix is computed once, by the first prompt, unless ``warm``
        (an earlier wave left it in the cache)."""
        first = 0.0 if warm else 1.0    # the prompt that computes the shared prefix
        new = maximum(L * (b * (1.0 - s) + first * s), 1.0)
        chunks = ceil(new / CHUNK_TOKENS)
        chunk = new / chunks
        gemm = chunks * maximum(chunk * self.mm, self.weights_pass)
        attn = (self.attn_pf * L * L * (first + (b - first) * (1.0 - s * s))
                + self.attn_pf_linear * new)
        comm = chunks * (2.0 * self.n_layers) * self.tp_ar(chunk * self.act_bytes)
        return (gemm, attn, comm, chunks * self.n_layers, 1.0)

    def memo_decode(self, b: float, c: float, d: float) -> tuple:
        """``decode`` of floats, memoised (the configurations of one query share most rows)."""
        key = ("d", b, c, d)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._remember(key, self.decode(b, c, d))
        return hit

    def memo_prefill(self, b: float, L: float, s: float, warm: bool) -> tuple:
        key = ("p", b, L, s, warm and s > 0)     # without a shared prefix, warm is cold
        hit = self._memo.get(key)
        if hit is None:
            hit = self._remember(key, self.prefill(b, L, s, warm))
        return hit

    def _remember(self, key, value):
        if len(self._memo) >= MEMO_SIZE:
            self._memo.clear()
        self._memo[key] = value
        return value


MEMO_SIZE = 4096


def physics_for(shape: ModelShape, si: Silicon, tp: int) -> Physics:
    """The ``Physics`` of a model on a GPU type and TP size (kept with the shape)."""
    key = (si, tp)
    hit = shape.physics.get(key)
    if hit is None:
        if len(shape.physics) >= 64:    # silicon objects replaced (profiles reloaded)
            shape.physics.clear()
        hit = shape.physics[key] = Physics(shape, si, tp)
    return hit


def decode_terms(shape: ModelShape, hw: Hardware, batch, context, dcp) -> tuple:
    """The ``DECODE_TERMS`` of one decode step, in that order: each a float (float inputs) or
    an array (array inputs broadcast together; count terms may stay scalars)."""
    return physics_for(shape, hw.silicon, hw.tp).decode(batch, context, dcp)


def prefill_terms(shape: ModelShape, hw: Hardware, batch, context, share=0.0,
                  warm: bool = False) -> tuple:
    """The ``PREFILL_TERMS`` of a prefill (``Physics.prefill``): floats or arrays."""
    return physics_for(shape, hw.silicon, hw.tp).prefill(batch, context, share, warm)


def stack(terms: tuple, n: int) -> np.ndarray:
    """(n, len(terms)) array of terms given as arrays or scalars (broadcast); column-major,
    so each term is one contiguous write."""
    out = np.empty((len(terms), n))
    for j, t in enumerate(terms):
        out[j] = t
    return out.T
