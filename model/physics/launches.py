"""How many kernels an engine launches in one decode step of a served model: the count the
decode step's fixed cost (``kernel_fixed``) is priced per.

A decode step at small batch reads little; what it cannot avoid is running its kernels one after
the other. Inside a CUDA-graph replay each kernel still costs its launch, its ramp-up and its tail
(1-2 us on an H200), whatever it computes, so a step's fixed cost follows the kernels it runs,
not the count of its layers: a Qwen3-Next layer (Gated DeltaNet, block-FP8 projections, a shared
expert) runs about twice the kernels of a Qwen3-30B-A3B layer
(``bench/real_engines/decode_floors.py launches``: the fixed part of the real H200 batch-1 steps
is 1.3-2.0 us per kernel on SGLang and 0.6-1.9 on vLLM, where per layer it spans 2.9x and 5.7x).

``census`` counts a model's parts (``Census``); each engine says how many kernels one part
launches in its decode step (``engine_advisor.model.engines.base.DecodeKernels``, counted from
its decode-step profiles); ``decode_launches`` is their product.
"""

from __future__ import annotations

from typing import NamedTuple

from engine_advisor.model import engines
from engine_advisor.model.engines.base import DecodeKernels
from engine_advisor.model.physics.shape import ModelShape

# GEMMs per part whose weights a checkpoint may hold in block-scaled FP8 (each quantises its
# input activations first, a kernel of its own): the QKV and output projections of attention,
# the input and output projections of a linear-attention layer (Gated DeltaNet: two input
# projections), gate-up and down of a feed-forward or shared expert
GEMMS = {"attention": 2.0, "mla": 4.0, "delta_rule": 3.0, "mamba2": 2.0, "dense_mlp": 2.0,
         "shared_expert": 2.0}
FP8_BLOCK = "fp8 block"


class Census(NamedTuple):
    """A served model's parts, as ``DecodeKernels`` counts kernels per part."""

    sublayer: float        # mixers and feed-forwards (each has its norm and residual add)
    attention: float       # GQA / MHA layers, full and sliding-window
    mla: float
    delta_rule: float      # Gated DeltaNet and KDA layers
    mamba2: float
    dense_mlp: float       # dense feed-forwards
    moe: float             # MoE layers
    shared_expert: float   # MoE layers with shared experts
    fp8_gemm: float        # GEMMs on block-scaled FP8 weights (``GEMMS``)
    step: float = 1.0


def census(shape: ModelShape) -> Census:
    """The parts of ``shape`` (a bare shape: its one attention layer and a dense feed-forward)."""
    mla = shape.attention == "mla"
    attn = float(shape.n_full_layers + shape.n_window_layers)
    linear = float(shape.n_linear_layers)
    kind = shape.linear_kind or ""
    mixers = attn + linear
    sublayers = float(shape.n_sublayers or 2 * shape.n_layers)
    ffn = max(sublayers - mixers, 0.0)
    moe = float(shape.n_moe_layers if shape.n_experts else 0)
    shared = moe if shape.n_shared_experts else 0.0
    parts = {"attention": 0.0 if mla else attn, "mla": attn if mla else 0.0,
             "delta_rule": linear if kind in ("gdn", "kda") else 0.0,
             "mamba2": linear if kind == "mamba2" else 0.0,
             "dense_mlp": max(ffn - moe, 0.0), "shared_expert": shared}
    dtypes = shape.summary.get("part_dtypes") or {}
    owner = {"attention": "attention", "mla": "attention", "delta_rule": "linear_attention",
             "mamba2": "linear_attention", "dense_mlp": "dense_mlp",
             "shared_expert": "shared_experts"}
    fp8 = sum(GEMMS[p] * n for p, n in parts.items()
              if FP8_BLOCK in str(dtypes.get(owner[p], "")))
    return Census(sublayer=sublayers, moe=moe, fp8_gemm=fp8, **parts)


def launches(kernels: DecodeKernels, parts: Census) -> float:
    """Kernels one decode step launches outside its fused-MoE calls: each part's count times
    the kernels it launches."""
    return float(sum(k * n for k, n in zip(kernels[:len(parts)], parts, strict=True)))


def engine_kernels(engine: str) -> DecodeKernels:
    """``engine``'s decode kernels per part (an engine it does not know: the reference)."""
    known = engines.REGISTRY.get(engine)
    return known.decode_kernels if known is not None else DecodeKernels()


def profiled_launches(engine: str, shape: ModelShape) -> float:
    """Every kernel a profile of one decode step shows: ``decode_launches`` and the fused-MoE
    calls' own (``DecodeKernels.moe_call`` per MoE layer, priced by ``moe_fixed``)."""
    return decode_launches(engine, shape) + engine_kernels(engine).moe_call * census(shape).moe


_CACHE: dict[tuple, float] = {}


def decode_launches(engine: str, shape: ModelShape) -> float:
    """Kernels ``engine`` launches in one decode step of ``shape`` (an engine it does not know:
    the reference counts, ``DecodeKernels()``)."""
    key = (engine, shape.key, shape.n_layers, shape.attention)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= 4096:
            _CACHE.clear()
        hit = _CACHE[key] = launches(engine_kernels(engine), census(shape))
    return hit
