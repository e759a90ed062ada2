"""What the cost model needs to know about the served model, at one KV-cache dtype.

``ModelShape`` condenses an ``engine_advisor.model.arch.Architecture`` (a Hugging Face config or a
preset) into the numbers the physical terms use: bytes per token per full-attention layer,
per-sequence state, weight bytes read per decode step, FLOPs per token. A workload that gives only
``kv_bytes_per_token`` gets a *bare* shape: KV only, no weights and no FLOPs known, so the weight
and compute terms are zero and KV capacity is an upper bound (``weights_known`` is False).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Literal

import numpy as np

from engine_advisor.model.arch import PRESETS, from_hf_config, preset

if TYPE_CHECKING:
    from engine_advisor.model.arch import Architecture

Attention = Literal["mla", "gqa", "mha", "unknown"]


@dataclass(frozen=True)
class ModelShape:
    name: str
    key: str                     # calibration key: name + architecture hash
    kv_dtype: str
    attention: Attention
    n_layers: int
    n_full_layers: int           # layers whose KV grows with context
    n_linear_layers: int         # layers with a constant per-sequence state
    kv_layer_bytes: float        # KV bytes per token of one full-attention layer
    kv_heads: int                # KV heads of a full-attention layer (1 for MLA's latent)
    q_heads: int
    hidden_size: int
    qk_dim: int                  # per-head dims the decode attention reads / writes
    v_dim: int
    state_bytes_per_seq: float   # constant per-sequence state (linear attention, windows)
    weight_bytes: float          # all weights, at the checkpoint's dtypes
    dense_step_bytes: float      # weight bytes a decode step reads whatever the batch
    n_moe_layers: int
    n_experts: int
    experts_per_token: int
    expert_bytes: float          # one routed expert of one layer
    matmul_flops: tuple[tuple[str, float], ...]   # FLOPs per token by compute dtype
    attn_flops_per_ctx_token: float  # decode: one new token x one context token, all layers
    attn_prefill_coef: float     # causal prefill attention FLOPs = coef x L^2 (one sequence)
    attn_prefill_linear: float = 0.0  # + this x L: sliding-window layers (window-bounded)
    weights_known: bool = True
    # the routed experts' share of matmul_flops, by compute dtype (their own kernels)
    moe_matmul_flops: tuple[tuple[str, float], ...] = ()
    # mixers and feed-forwards (2 per standard decoder layer, 1 per Nemotron-H block; 0: 2 per
    # layer): each ends in a row-parallel projection
    n_sublayers: int = 0
    # the routed experts' checkpoint dtype ("bf16", "fp8 block 128x128"), one expert's
    # intermediate size and the shared experts: what picks an engine's fused-MoE kernel
    # (``engine_advisor.model.physics.moe.moe_kernel``)
    expert_dtype: str = ""
    expert_intermediate: int = 0
    n_shared_experts: int = 0
    # linear-attention layers: kind, one layer's convolution and recurrent state elements, the state
    # dtype the config declares (engine_advisor.model.arch.Architecture), the chunked prefill
    # kernels' FLOPs and bytes per prompt token and the recurrent update's FLOPs per decoded token
    linear_kind: str | None = None
    linear_conv_elems: float = 0.0
    linear_ssm_elems: float = 0.0
    linear_ssm_dtype: str | None = None
    linear_ssm_cache_dtype: str | None = None
    linear_prefill_flops: float = 0.0
    linear_prefill_bytes: float = 0.0
    linear_step_flops: float = 0.0
    window_bytes_per_seq: float = 0.0   # sliding-window KV a sequence holds at most
    n_window_layers: int = 0            # sliding-window layers (their KV per token is a full
    window_tokens: int = 0              # layer's, ``kv_layer_bytes``) and their window
    max_context: int | None = None      # max_position_embeddings: what engines launch for
    summary: dict = field(default_factory=dict, compare=False, hash=False)
    # engine_advisor.model.physics.terms.Physics per (silicon, tp), built on first use; a replaced
    # copy starts empty
    physics: dict = field(init=False, default_factory=dict, compare=False, hash=False,
                          repr=False)

    @property
    def matmul_flops_per_token(self) -> float:
        return float(sum(f for _, f in self.matmul_flops))

    @property
    def dense_and_moe_flops(self) -> tuple[tuple[tuple[str, float], ...],
                                           tuple[tuple[str, float], ...]]:
        """(dense, routed-expert) matmul FLOPs per token, each by compute dtype."""
        moe = dict(self.moe_matmul_flops)
        dense = tuple((k, f - moe.get(k, 0.0)) for k, f in self.matmul_flops
                      if f - moe.get(k, 0.0) > 0.0)
        return dense, self.moe_matmul_flops

    @property
    def kv_bytes_per_token(self) -> float:
        return self.n_full_layers * self.kv_layer_bytes

    @property
    def layer_units(self) -> float:
        """Decoder layers for the per-layer fixed costs and the two all-reduces per layer:
        half the mixers and feed-forwards."""
        return self.n_sublayers / 2.0 if self.n_sublayers else float(self.n_layers)

    def shards(self, tp: int) -> int:
        """Over how many TP ranks one token's KV is split (1: every rank holds all of it)."""
        if self.attention in ("gqa", "mha") and self.kv_heads:
            return max(1, min(tp, self.kv_heads))
        return 1

    def kv_gpu_token_bytes(self, tp: int) -> float:
        """KV bytes per token one GPU holds before DCP (all full-attention layers)."""
        return self.kv_bytes_per_token / self.shards(tp)

    def experts_touched(self, tokens):
        """Expected routed experts one MoE layer's GEMMs read for a batch of ``tokens`` (a
        float or an array): E (1 - (1 - k/E)^tokens) (distinct experts under uniform
        routing)."""
        if isinstance(tokens, (list, tuple)):
            tokens = np.asarray(tokens, dtype=float)
        if not self.n_experts:
            return tokens * 0.0
        e, k = float(self.n_experts), float(self.experts_per_token)
        return e * (1.0 - (1.0 - k / e) ** tokens)

    def step_weight_bytes(self, tokens):
        """Weight bytes one decode step over ``tokens`` sequences reads (whole model)."""
        return (self.dense_step_bytes
                + self.n_moe_layers * self.experts_touched(tokens) * self.expert_bytes)


def _key(name: str, payload: str) -> str:
    return f"{name}@{hashlib.sha256(payload.encode()).hexdigest()[:10]}"


def compute_dtype(weight_dtype: str) -> str:
    """The tensor-core math a weight dtype runs in: fp8 weights in fp8; NVFP4 (w4a4) in fp4;
    MXFP4 / int4 weight-only formats with fp8 or bf16 activations, counted at the fp8 rate
    (mxfp4) or bf16 (int4, dequantised); everything else bf16."""
    d = weight_dtype.lower()
    if "nvfp4" in d:
        return "fp4"
    if "mxfp4" in d or "fp8" in d:
        return "fp8"
    return "bf16"


def from_architecture(arch: Architecture, kv_dtype: str) -> ModelShape:
    mla = arch.attention == "mla"
    if mla:
        qk = arch.kv_lora_rank + arch.qk_rope_head_dim
        v = arch.kv_lora_rank
    else:
        qk, v = arch.head_dim, arch.v_head_dim
    full = max(arch.n_full_attn_layers, 0)
    layer_bytes = arch.kv_bytes_per_layer_token(kv_dtype) if full else 0.0
    dtypes = dict(arch.part_dtypes)
    flops: dict[str, float] = {}
    for part, params in arch.matmul_parts:
        if part in ("embed", "routed_experts"):
            continue
        key = compute_dtype(dtypes.get(part, "bf16"))
        flops[key] = flops.get(key, 0.0) + 2.0 * params
    moe_flops: tuple[tuple[str, float], ...] = ()
    if arch.n_moe_layers:
        key = compute_dtype(dtypes.get("routed_experts", "bf16"))
        routed = 2.0 * arch.n_moe_layers * arch.experts_per_token * arch.routed_expert_params
        flops[key] = flops.get(key, 0.0) + routed
        moe_flops = ((key, routed),)
    if arch.tie_word_embeddings:
        flops["bf16"] += 2.0 * arch.vocab_size * arch.hidden_size
    # prefill attention: quadratic part (full layers) and linear part (sliding windows)
    big = 1.0e6   # f(L) = q L^2 + l L  ->  q = (f(2L) - 2 f(L)) / 2 L^2, l = (f(L) - q L^2) / L
    f1, f2 = float(arch.attn_prefill_flops(big)), float(arch.attn_prefill_flops(2 * big))
    quad = (f2 - 2 * f1) / (2 * big ** 2)
    lin = (f1 - quad * big ** 2) / big
    return ModelShape(
        name=arch.name, key=f"{arch.name}@{arch.arch_hash[:10]}", kv_dtype=kv_dtype,
        attention=arch.attention, n_layers=arch.n_layers, n_full_layers=full,
        n_linear_layers=arch.n_linear_layers, kv_layer_bytes=float(layer_bytes),
        kv_heads=1 if mla else arch.kv_heads, q_heads=arch.q_heads,
        hidden_size=arch.hidden_size, qk_dim=qk, v_dim=v,
        state_bytes_per_seq=float(arch.state_bytes_per_seq(kv_dtype)),
        weight_bytes=float(arch.weight_bytes),
        dense_step_bytes=float(arch.dense_weight_bytes_per_token_step),
        n_moe_layers=arch.n_moe_layers, n_experts=arch.n_routed_experts or 0,
        experts_per_token=arch.experts_per_token or 0,
        expert_bytes=float(arch.routed_expert_bytes or 0.0),
        matmul_flops=tuple(sorted(flops.items())),
        attn_flops_per_ctx_token=float(arch.attn_decode_flops_per_ctx_token),
        attn_prefill_coef=quad, attn_prefill_linear=max(lin, 0.0), moe_matmul_flops=moe_flops,
        n_sublayers=arch.n_sublayers, linear_kind=arch.linear_kind,
        expert_dtype=str(dtypes.get("routed_experts", "")) if arch.n_moe_layers else "",
        expert_intermediate=int(arch.expert_intermediate or 0),
        n_shared_experts=int(arch.n_shared_experts or 0),
        linear_conv_elems=float(arch.linear_conv_elems),
        linear_ssm_elems=float(arch.linear_ssm_elems), linear_ssm_dtype=arch.linear_ssm_dtype,
        linear_ssm_cache_dtype=arch.linear_ssm_cache_dtype,
        linear_prefill_flops=float(arch.linear_prefill_flops_per_token),
        linear_prefill_bytes=float(arch.linear_prefill_bytes_per_token),
        linear_step_flops=float(arch.linear_attn_flops_per_token),
        window_bytes_per_seq=float(arch.state_bytes_per_seq(kv_dtype)
                                   - arch.linear_state_bytes_per_seq),
        n_window_layers=arch.n_sliding_layers if arch.sliding_window else 0,
        window_tokens=int(arch.sliding_window or 0) if arch.n_sliding_layers else 0,
        max_context=arch.max_context, summary=arch.to_dict())


def bare(kv_bytes_per_token: float, kv_dtype: str = "bf16", attention: Attention = "unknown",
         kv_heads: int | None = None, weight_bytes: float | None = None) -> ModelShape:
    """A model known only by its KV bytes per token (one pseudo-layer, no weights or FLOPs)."""
    return ModelShape(
        name=f"kv{int(kv_bytes_per_token)}",
        key=_key(f"kv{int(kv_bytes_per_token)}", f"{kv_bytes_per_token}"),
        kv_dtype=kv_dtype, attention=attention, n_layers=1, n_full_layers=1,
        n_linear_layers=0, kv_layer_bytes=float(kv_bytes_per_token), kv_heads=kv_heads or 1,
        q_heads=0, hidden_size=0, qk_dim=0, v_dim=0, state_bytes_per_seq=0.0,
        weight_bytes=float(weight_bytes or 0.0), dense_step_bytes=0.0, n_moe_layers=0,
        n_experts=0, experts_per_token=0, expert_bytes=0.0, matmul_flops=(),
        attn_flops_per_ctx_token=0.0, attn_prefill_coef=0.0,
        weights_known=weight_bytes is not None)


@lru_cache(maxsize=64)
def preset_shape(name: str, kv_dtype: str) -> ModelShape:
    return from_architecture(preset(name), kv_dtype)


# config.json contents of the rows' ``hf:NAME@HASH`` architectures
# (engine_advisor.calibration.sweep.served_model), registered by whoever read them from the run
# folders (``register_row_config``)
ROW_CONFIGS: dict[str, dict] = {}


def register_row_config(key: str, config: dict) -> None:
    """Make a row's ``hf:`` architecture key resolvable by ``shape_of``."""
    ROW_CONFIGS[key] = config
    _row_shape.cache_clear()


@lru_cache(maxsize=64)
def _row_shape(key: str, kv_dtype: str) -> ModelShape:
    return from_architecture(from_hf_config(ROW_CONFIGS[key], name=key.split("@")[0][3:]),
                             kv_dtype)


def shape_of(model: str, kv_dtype: str, kv_bytes_per_token: int, kv_shards: int = 1) -> ModelShape:
    """The served model of a dataset row: its preset when ``model`` names one, its registered
    config.json for an ``hf:`` key (its KV bytes must agree either way), else a bare shape from
    the KV bytes (``kv_shards`` > 1: GQA heads split)."""
    if model.startswith("hf:"):
        if model not in ROW_CONFIGS:
            raise ValueError(f"model: {model!r} names a config.json that is not loaded (fit reads "
                             "it from the run folder's model-config.json)")
        shape = _row_shape(model, kv_dtype)
        if abs(shape.kv_bytes_per_token - kv_bytes_per_token) > 0.5:
            raise ValueError(f"kv_bytes_per_token: {kv_bytes_per_token} disagrees with {model!r} "
                             f"at {kv_dtype} ({shape.kv_bytes_per_token:.0f})")
        return shape
    if model in PRESETS:
        shape = preset_shape(model, kv_dtype)
        if abs(shape.kv_bytes_per_token - kv_bytes_per_token) > 0.5:
            raise ValueError(f"kv_bytes_per_token: {kv_bytes_per_token} disagrees with preset "
                             f"{model!r} at {kv_dtype} ({shape.kv_bytes_per_token:.0f})")
        return shape
    if kv_shards > 1:
        return bare(kv_bytes_per_token, kv_dtype, "gqa", kv_shards)
    return bare(kv_bytes_per_token, kv_dtype)
