"""The physics of a served model, derived once from its config.json: what it stores per token
and per sequence, what it reads per decode step, and how many FLOPs it does.

Units: bytes, parameters (elements), FLOPs (one multiply-add = 2 FLOPs). All counts are for the
whole model, not per GPU (the cost model divides by tensor / decode-context parallelism).
Layer kinds: full attention (MLA or GQA/MHA: KV grows with the context), sliding-window
attention (KV capped at the window per sequence) and linear attention (Kimi Delta Attention or
Gated DeltaNet: a constant recurrent state per sequence).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import numpy as np

from engine_advisor.model.arch.config import ArchConfigError, Config, text_config
from engine_advisor.model.arch.layout import DENSE, FULL, LINEAR, SLIDING, layout
from engine_advisor.model.arch.quant import parse as parse_quantization
from engine_advisor.model.arch.weights import PARTS, count

KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1}
RECURRENT_STATE_BYTES = 4   # linear-attention recurrent state: fp32 (SGLang's default, KDA on vLLM)
CONV_STATE_BYTES = 2        # short-convolution state: the activations' dtype, bf16
FLA_CHUNK = 64              # the chunk of the flash-linear-attention kernels (KDA, GDN) both
#                             engines prefill with
CHUNK_STATE_BYTES = 2       # a chunk's state as the chunked kernels keep it between kernels


def kv_dtype_bytes(kv_dtype: str) -> int:
    try:
        return KV_DTYPE_BYTES[kv_dtype]
    except (KeyError, TypeError):
        raise ArchConfigError("kv_cache_dtype", f"unknown KV dtype {kv_dtype!r}; known: "
                              f"{', '.join(KV_DTYPE_BYTES)}") from None


def _causal_pairs(n, window: float = np.inf):
    """Query-key pairs of causal attention over the first n tokens of a sequence, each token
    seeing itself and at most ``window`` - 1 earlier ones: sum over i < n of min(i + 1, w)."""
    n = np.asarray(n, dtype=float)
    w = min(window, 1e300)
    inside = np.minimum(n, w)
    return inside * (inside + 1) / 2 + np.maximum(n - w, 0.0) * w


@dataclass(frozen=True)
class Architecture:
    """Derived physics of one model (see the module docstring for units). Derived scalars are
    computed on first use and kept on the (immutable) instance."""

    name: str
    model_type: str | None
    hidden_size: int
    vocab_size: int
    n_layers: int
    max_context: int | None           # max_position_embeddings
    # attention (full and sliding layers share one geometry)
    attention: str                    # "mla" | "gqa" | "mha"
    q_heads: int
    kv_heads: int                     # 1 for MLA (one latent per token and layer)
    head_dim: int                     # query/key head dim (MLA: qk_nope + qk_rope)
    v_head_dim: int
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    qk_nope_head_dim: int | None
    q_lora_rank: int | None           # None: full-rank query projection
    n_full_attn_layers: int
    n_sliding_layers: int
    sliding_window: int | None        # tokens
    n_linear_layers: int
    linear_kind: str | None           # "kda" | "gdn" | "mamba2" | None
    linear_heads: int                 # value heads, one recurrent state each (0: none)
    linear_head_dim: int              # key head dim dk
    linear_value_head_dim: int        # dv
    linear_conv_kernel: int
    linear_conv_channels: int         # channels of the short convolution (q, k and v)
    linear_chunk: int                 # tokens per chunk of the chunked prefill kernels
    # the recurrent state's dtype as the config.json declares it, under the two keys engines
    # read (SGLang ``mamba_ssm_dtype``, vLLM Nemotron-H's ``mamba_ssm_cache_dtype``)
    linear_ssm_dtype: str | None
    linear_ssm_cache_dtype: str | None
    # feed-forward
    n_moe_layers: int
    n_dense_mlp_layers: int
    # mixers and feed-forwards (2 per standard decoder layer; 1 per Nemotron-H block): each ends
    # in a row-parallel projection and is about half a layer's kernel launches
    n_sublayers: int
    n_routed_experts: int             # per MoE layer
    experts_per_token: int
    n_shared_experts: int
    expert_intermediate: int          # one routed expert's intermediate size
    expert_hidden: int                # the width routed experts run at (latent MoE: < hidden)
    shared_intermediate: int          # all shared experts of a layer together
    dense_intermediate: int
    tie_word_embeddings: bool
    # weights at the checkpoint's dtypes (quantization scales included)
    weight_dtype: str                 # summary, e.g. "bf16; routed_experts: mxfp4 g32"
    part_dtypes: tuple[tuple[str, str], ...]
    params_parts: tuple[tuple[str, float], ...]
    bytes_parts: tuple[tuple[str, float], ...]
    matmul_parts: tuple[tuple[str, float], ...]
    routed_expert_params: float       # one expert of one layer
    routed_expert_bytes: float        # one expert of one layer
    arch_hash: str = field(init=False, default="")

    def __post_init__(self):
        physics = {f.name: getattr(self, f.name) for f in fields(self)
                   if f.name not in ("name", "arch_hash")}
        blob = json.dumps(physics, sort_keys=True, separators=(",", ":"), default=str)
        object.__setattr__(self, "arch_hash", hashlib.sha256(blob.encode()).hexdigest()[:16])

    def __hash__(self) -> int:         # the physics hash plus the name: cheap dict keys
        return hash((self.name, self.arch_hash))

    # ---- weights ---------------------------------------------------------------------------
    @property
    def params_by_part(self) -> dict[str, float]:
        return dict(self.params_parts)

    @cached_property
    def total_params(self) -> float:
        return sum(v for _, v in self.params_parts)

    @property
    def weight_bytes_by_part(self) -> dict[str, float]:
        """Bytes per part: embed, lm_head, attention, linear_attention, dense_mlp,
        shared_experts, routed_experts, other (norms, routers, latent-MoE projections)."""
        return dict(self.bytes_parts)

    @cached_property
    def weight_bytes(self) -> float:
        return sum(v for _, v in self.bytes_parts)

    @cached_property
    def dense_weight_bytes_per_token_step(self) -> float:
        """Bytes every decode step reads whatever the batch: all weights but the routed experts
        and the embedding table (a step reads only its tokens' rows). With tied embeddings the
        table is the lm_head and is read."""
        b = self.weight_bytes_by_part
        embed = 0.0 if self.tie_word_embeddings else b["embed"]
        return self.weight_bytes - b["routed_experts"] - embed

    def expected_experts_touched(self, tokens):
        """Expected distinct routed experts per MoE layer hit by ``tokens`` tokens, each routed
        to k of E experts uniformly: E (1 - (1 - k/E)^tokens). Vectorised; 0 for dense models."""
        t = np.asarray(tokens, dtype=float)
        if not self.n_routed_experts:
            return np.zeros_like(t)
        if self.experts_per_token == self.n_routed_experts:
            return np.where(t > 0, float(self.n_routed_experts), 0.0)
        return self.n_routed_experts * -np.expm1(t * self._log_miss)

    @cached_property
    def _log_miss(self) -> float:
        """log of the chance that one token misses a given expert: log(1 - k/E)."""
        return math.log1p(-self.experts_per_token / self.n_routed_experts)

    def decode_weight_bytes(self, tokens):
        """Weight bytes one decode step of ``tokens`` tokens reads: the dense part plus the
        expected routed experts of every MoE layer (vectorised)."""
        return (self.dense_weight_bytes_per_token_step + self.n_moe_layers
                * self.expected_experts_touched(tokens) * self.routed_expert_bytes)

    # ---- compute ---------------------------------------------------------------------------
    @cached_property
    def active_params_per_token(self) -> float:
        """Parameters whose matmuls one token goes through: attention and linear-attention
        projections, dense MLPs, shared experts, k routed experts per MoE layer, MoE routers and
        latent projections, lm_head. The embedding lookup is not a matmul."""
        m = dict(self.matmul_parts)
        routed = self.n_moe_layers * self.experts_per_token * self.routed_expert_params
        tied_head = self.vocab_size * self.hidden_size if self.tie_word_embeddings else 0
        return sum(v for k, v in m.items() if k not in ("routed_experts", "embed")) \
            + routed + tied_head

    @cached_property
    def matmul_flops_per_token(self) -> float:
        return 2.0 * self.active_params_per_token

    @cached_property
    def attn_decode_flops_per_ctx_token(self) -> float:
        """FLOPs of one new token attending to one context token, summed over the full-attention
        layers. MLA with absorbed weights: per head 2 (kv_lora_rank + qk_rope) for the scores
        and 2 kv_lora_rank for the values; GQA/MHA: per query head 2 head_dim twice."""
        if self.attention == "mla":
            per_head = 2 * (self.kv_lora_rank + self.qk_rope_head_dim) + 2 * self.kv_lora_rank
        else:
            per_head = 2 * self.head_dim + 2 * self.v_head_dim
        return float(self.q_heads * per_head * self.n_full_attn_layers)

    @cached_property
    def _prefill_flops_per_pair(self) -> float:
        """FLOPs per (query, key) pair and layer in prefill: scores 2 qk_dim + values 2 v_dim
        per query head (MLA prefill runs unabsorbed: qk_dim = qk_nope + qk_rope)."""
        return 2.0 * self.q_heads * (self.head_dim + self.v_head_dim)

    def attn_prefill_flops(self, length):
        """Causal attention FLOPs of one sequence of ``length`` new tokens: per layer
        heads x 2 (qk_dim + v_dim) x L (L + 1) / 2 ~ heads x (qk_dim + v_dim) x L^2 on the
        full-attention layers, plus the sliding layers with each query seeing at most the
        window. Linear-attention layers: ``linear_attn_flops_per_token``. Vectorised."""
        return self.attn_prefill_flops_suffix(length, 0)

    def attn_prefill_flops_suffix(self, length, cached):
        """The same for the ``length - cached`` tokens after a cached prefix of ``cached``
        tokens (prefix reuse): they attend to all ``length`` tokens. Vectorised."""
        length = np.asarray(length, dtype=float)
        cached = np.minimum(np.asarray(cached, dtype=float), length)
        pairs = self.n_full_attn_layers * (_causal_pairs(length) - _causal_pairs(cached))
        if self.n_sliding_layers:
            w = float(self.sliding_window)
            pairs = pairs + self.n_sliding_layers * (_causal_pairs(length, w)
                                                     - _causal_pairs(cached, w))
        return self._prefill_flops_per_pair * pairs

    @cached_property
    def linear_attn_flops_per_token(self) -> float:
        """Recurrent-update FLOPs of the linear-attention layers for one decoded token: per
        head about 8 dk dv (decay, k^T S, rank-1 delta update, q^T S; Mamba2's decay, B x^T
        and C h are fewer, counted the same)."""
        return (8.0 * self.n_linear_layers * self.linear_heads * self.linear_head_dim
                * self.linear_value_head_dim)

    @cached_property
    def linear_prefill_flops_per_token(self) -> float:
        """FLOPs of the chunked prefill kernels per prompt token, all linear-attention layers.
        Per value head and token, chunks of C tokens: the delta rule (KDA, GDN) scores a
        token against the C / 2 earlier ones of its chunk on average, for its output and for
        the chunk's WY transform, 2 C (dk + dv), and reads, corrects and updates the chunk
        state, 6 dk dv; Mamba2's SSD has no transform, C (dk + dv) + 4 dk dv."""
        if not self.n_linear_layers:
            return 0.0
        c, dk, dv = float(self.linear_chunk), self.linear_head_dim, self.linear_value_head_dim
        per_head = (c * (dk + dv) + 4.0 * dk * dv if self.linear_kind == "mamba2"
                    else 2.0 * c * (dk + dv) + 6.0 * dk * dv)
        return self.n_linear_layers * self.linear_heads * per_head

    @cached_property
    def linear_prefill_bytes_per_token(self) -> float:
        """HBM bytes of the chunked prefill kernels per prompt token, all linear-attention
        layers: each chunk's state (dk x dv per head) written by one kernel and read by the
        next, and the token's inputs (the convolved q, k, v channels) read and its output
        written, in bf16."""
        if not self.n_linear_layers:
            return 0.0
        states = (2.0 * self.linear_heads * self.linear_head_dim * self.linear_value_head_dim
                  * CHUNK_STATE_BYTES / self.linear_chunk)
        io = 2.0 * self.linear_conv_channels * CONV_STATE_BYTES
        return self.n_linear_layers * (states + io)

    # ---- KV and state ----------------------------------------------------------------------
    def kv_bytes_per_layer_token(self, kv_dtype: str = "bf16") -> int:
        """KV bytes of one token in one attention layer: MLA one latent of kv_lora_rank +
        qk_rope_head_dim; GQA/MHA K and V of kv_heads x head_dim."""
        b = kv_dtype_bytes(kv_dtype)
        if self.attention == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * b
        return self.kv_heads * (self.head_dim + self.v_head_dim) * b

    def kv_bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        """KV bytes per context token over the full-attention layers (grows with context)."""
        return self.n_full_attn_layers * self.kv_bytes_per_layer_token(kv_dtype)

    def sliding_kv_bytes_per_token(self, kv_dtype: str = "bf16") -> int:
        """KV bytes per token over the sliding-window layers; a sequence holds at most
        ``sliding_window`` tokens of it (``sliding_kv_bytes_per_seq``)."""
        return self.n_sliding_layers * self.kv_bytes_per_layer_token(kv_dtype)

    def sliding_kv_bytes_per_seq(self, context_tokens, kv_dtype: str = "bf16"):
        ctx = np.asarray(context_tokens, dtype=float)
        if not self.n_sliding_layers:
            return np.zeros_like(ctx)
        return np.minimum(ctx, self.sliding_window) * self.sliding_kv_bytes_per_token(kv_dtype)

    @property
    def linear_conv_elems(self) -> int:
        """Short-convolution state elements of one linear-attention layer: kernel - 1 past
        inputs of its channels."""
        return max(self.linear_conv_kernel - 1, 0) * self.linear_conv_channels

    @property
    def linear_ssm_elems(self) -> int:
        """Recurrent state elements of one linear-attention layer: dk x dv per value head."""
        return self.linear_heads * self.linear_head_dim * self.linear_value_head_dim

    @cached_property
    def linear_state_bytes_per_seq(self) -> int:
        """Constant state of the linear-attention layers per sequence: per layer and value head
        a dk x dv recurrent state in fp32, plus the short-convolution window (kernel - 1 past
        inputs of the q, k and v channels) in bf16."""
        if not self.n_linear_layers:
            return 0
        recurrent = (self.linear_heads * self.linear_head_dim * self.linear_value_head_dim
                     * RECURRENT_STATE_BYTES)
        conv = (self.linear_conv_kernel - 1) * self.linear_conv_channels * CONV_STATE_BYTES
        return self.n_linear_layers * (recurrent + conv)

    def state_bytes_per_seq(self, kv_dtype: str = "bf16") -> int:
        """Per-sequence memory that does not grow with the context: linear-attention state
        (fp32 recurrent + bf16 conv) plus sliding-window KV at the full window."""
        window = self.n_sliding_layers and self.sliding_window * self.sliding_kv_bytes_per_token(
            kv_dtype)
        return self.linear_state_bytes_per_seq + int(window)

    # ---- summary ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (KV figures at bf16)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("part_dtypes", "params_parts", "bytes_parts", "matmul_parts")}
        out.update(
            part_dtypes=dict(self.part_dtypes), params_by_part=self.params_by_part,
            weight_bytes_by_part=self.weight_bytes_by_part, total_params=self.total_params,
            weight_bytes=self.weight_bytes,
            dense_weight_bytes_per_token_step=self.dense_weight_bytes_per_token_step,
            active_params_per_token=self.active_params_per_token,
            matmul_flops_per_token=self.matmul_flops_per_token,
            attn_decode_flops_per_ctx_token=self.attn_decode_flops_per_ctx_token,
            linear_attn_flops_per_token=self.linear_attn_flops_per_token,
            linear_prefill_flops_per_token=self.linear_prefill_flops_per_token,
            linear_prefill_bytes_per_token=self.linear_prefill_bytes_per_token,
            kv_bytes_per_token=self.kv_bytes_per_token("bf16"),
            kv_bytes_per_layer_token=self.kv_bytes_per_layer_token("bf16"),
            sliding_kv_bytes_per_token=self.sliding_kv_bytes_per_token("bf16"),
            state_bytes_per_seq=self.state_bytes_per_seq("bf16"),
            linear_state_bytes_per_seq=self.linear_state_bytes_per_seq,
            kv_dtype="bf16")
        return out


def _summary(labels: dict[str, set], nbytes: dict[str, float]) -> tuple[str, dict[str, str]]:
    part_dtype = {p: "+".join(sorted(s)) for p, s in labels.items() if s}
    by_label: dict[str, float] = {}
    for p, lab in part_dtype.items():
        by_label[lab] = by_label.get(lab, 0.0) + nbytes[p]
    main = max(by_label, key=by_label.get)
    rest = [f"{p}: {lab}" for p, lab in part_dtype.items() if lab != main]
    return "; ".join([main, *rest]), part_dtype


def from_hf_config(cfg: Any, *, name: str | None = None) -> Architecture:
    """The architecture of a Hugging Face config.json (its parsed contents). Multimodal
    wrappers are read through ``text_config``; raises ``ArchConfigError`` naming the field."""
    c = text_config(cfg)
    lay = layout(c)
    hidden, vocab = c.int("hidden_size"), c.int("vocab_size")
    tied = c.bool("tie_word_embeddings", False)
    quant = parse_quantization(c)
    model_type = c.str("model_type")
    tally = count(lay, quant, hidden, vocab, tied,
                  qk_norm=str(model_type).startswith("qwen3"))
    weight_dtype, part_dtypes = _summary(tally.labels, tally.bytes)
    att, lin, moe = lay.attention, lay.linear, lay.moe
    if name is None:
        archs = Config(cfg).get("architectures")
        name = (Config(cfg).str("_name_or_path") or (archs[0] if isinstance(archs, list) and archs
                                                    and isinstance(archs[0], str) else None)
                or model_type or "custom")
    n_moe = sum(lay.moe_layers)
    return Architecture(
        name=name, model_type=model_type, hidden_size=hidden, vocab_size=vocab,
        n_layers=len(lay.kinds), max_context=c.opt_int("max_position_embeddings"),
        attention=att.kind, q_heads=att.q_heads, kv_heads=att.kv_heads, head_dim=att.head_dim,
        v_head_dim=att.v_head_dim, kv_lora_rank=att.kv_lora_rank,
        qk_rope_head_dim=att.qk_rope_head_dim, qk_nope_head_dim=att.qk_nope_head_dim,
        q_lora_rank=att.q_lora_rank, n_full_attn_layers=lay.kinds.count(FULL),
        n_sliding_layers=lay.kinds.count(SLIDING), sliding_window=lay.sliding_window,
        n_linear_layers=lay.kinds.count(LINEAR), linear_kind=lin.kind if lin else None,
        linear_heads=lin.heads if lin else 0, linear_head_dim=lin.head_dim if lin else 0,
        linear_value_head_dim=lin.value_head_dim if lin else 0,
        linear_conv_kernel=lin.conv_kernel if lin else 0,
        linear_conv_channels=lin.conv_channels if lin else 0,
        linear_chunk=(0 if lin is None else c.int("chunk_size", c.int("mamba_chunk_size", 256))
                      if lin.kind == "mamba2" else FLA_CHUNK),
        linear_ssm_dtype=c.str("mamba_ssm_dtype") if lin else None,
        linear_ssm_cache_dtype=c.str("mamba_ssm_cache_dtype") if lin else None,
        n_moe_layers=n_moe, n_dense_mlp_layers=lay.ffn.count(DENSE),
        n_sublayers=lay.sublayers,
        n_routed_experts=moe.n_routed if moe else 0, experts_per_token=moe.per_token if moe else 0,
        n_shared_experts=moe.n_shared if moe else 0,
        expert_intermediate=moe.expert_intermediate if moe else 0,
        expert_hidden=moe.expert_hidden if moe else 0,
        shared_intermediate=moe.shared_intermediate if moe else 0,
        dense_intermediate=lay.dense_intermediate, tie_word_embeddings=tied,
        weight_dtype=weight_dtype, part_dtypes=tuple(sorted(part_dtypes.items())),
        params_parts=tuple((p, float(tally.params[p])) for p in PARTS),
        bytes_parts=tuple((p, float(tally.bytes[p])) for p in PARTS),
        matmul_parts=tuple((p, float(tally.matmul[p])) for p in PARTS),
        routed_expert_params=float(tally.routed_expert_params),
        routed_expert_bytes=float(tally.routed_expert_bytes))
