"""Memory fraction, KV capacity, linear-attention state and how many sequences run at once
(engine documentation and source).

Each engine's memory flag says what its fraction covers (``engine_advisor.model.engines``:
``mem_flag``, ``mem_covers``; vLLM's ``--gpu-memory-utilization`` budgets the whole instance,
SGLang's ``--mem-fraction-static`` weights + KV pool). Per GPU: ``budget = fraction x memory -
weights / tp - Engine.reserve(activation peak)``. Without linear-attention layers, ``capacity =
budget / (KV bytes per token per GPU / dcp)``. With them, each engine lays the state out its own way
(``engine_advisor.model.engines.base.StateLayout``, from the model's ``HybridShape`` here): vLLM
keeps state and KV in one pool of pages, SGLang splits the budget into a state pool and a KV pool;
``engine_advisor.model.formulas.memory.memory_fit`` computes the capacity, the state slots and the
sequences that run at once from it, for the recommender and the simulator alike. When a batch does
not fit, the engine runs what fits and admits the rest as running sequences finish
(``engine_advisor.model.formulas.rows.rows_into``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from engine_advisor.model import engines
from engine_advisor.model.engines.base import NO_STATE, HybridShape, StateLayout
from engine_advisor.model.hardware.gpus import gpu_family

if TYPE_CHECKING:
    from engine_advisor.model.physics.shape import ModelShape

DEFAULT_FRACTION = 0.90          # used when calibration says nothing about this engine and GPU
OOM_THRESHOLD = 0.95             # published: 0.95 gave OOM retries on B300 for both engines
GIB = 2 ** 30
# What an engine's memory fraction spends outside weights and KV (its reserve, and whether its
# budget holds the activation peak) is the engine's: model/engines/<engine>.py, read off the
# real start-up logs on one H200 (bench/data/h200-real/logs).
PROFILE_SEQS = 1024              # vLLM's max_num_seqs on an H200: the sampler's profiled rows
PROFILE_TOKENS = 8192            # its max_num_batched_tokens: the profiled forward pass
DEFAULT_ACTIVATION = 1.1 * GIB   # without an architecture


def sampler_row_bytes(summary: dict | None) -> float:
    """One profiled sequence's fp32 logits in vLLM's activation peak (its sampler profiles
    ``max_num_seqs`` of them)."""
    return float((summary or {}).get("vocab_size") or 0) * 4.0


def activation_pass_bytes(summary: dict | None, tp: int) -> float:
    """vLLM's profiled activation peak per GPU less the sampler's rows: one PROFILE_TOKENS-token
    pass's largest bf16 intermediate per token (the fused MoE's three caches of top-k x
    max(2 x expert intermediate / tp, hidden), or a dense MLP's gate and up projections and
    hidden state). Without an architecture: DEFAULT_ACTIVATION, all of it."""
    if not summary or not summary.get("hidden_size"):
        return DEFAULT_ACTIVATION
    h = float(summary["hidden_size"])
    dense = 2.0 * float(summary.get("dense_intermediate") or 0) / tp + 2.0 * h
    moe = 0.0
    if summary.get("n_moe_layers"):
        moe = 3.0 * float(summary["experts_per_token"]) * max(
            2.0 * float(summary["expert_intermediate"]) / tp, h)
    return PROFILE_TOKENS * 2.0 * max(dense, moe)


def activation_peak_bytes(summary: dict | None, tp: int, seqs: int = PROFILE_SEQS) -> float:
    """vLLM's profiled activation peak per GPU with ``max_num_seqs`` = ``seqs``: the sampler's
    fp32 logits of ``seqs`` rows plus one pass (``activation_pass_bytes``). On our H200 it
    gives 1.16 GiB for deepseek-v2-lite (1.09 logged) and 0.99 GiB for llama-3.1-8b (1.1
    logged); with 128 sequences 1.08 GiB for Nemotron-3-Nano (1.09 logged)."""
    return activation_pass_bytes(summary, tp) + sampler_row_bytes(summary) * min(
        seqs, PROFILE_TOKENS)


def hybrid_shape(shape: ModelShape, tp: int, gpu_name: str, gpu_memory: float
                 ) -> HybridShape | None:
    """What an engine's memory planner reads of a model with linear-attention layers or with
    sliding-window layers beside full-attention ones, per GPU at TP ``tp`` (None without
    either)."""
    linear = bool(shape.n_linear_layers and shape.linear_kind)
    windows = bool(shape.n_window_layers and shape.window_tokens and shape.n_full_layers)
    if not linear and not windows:
        return None
    return HybridShape(
        n_full=shape.n_full_layers, n_linear=shape.n_linear_layers if linear else 0,
        linear_kind=shape.linear_kind if linear else "", attention=shape.attention,
        attn_token_layer_bytes=shape.kv_layer_bytes / shape.shards(tp),
        conv_elems=shape.linear_conv_elems / tp, ssm_elems=shape.linear_ssm_elems / tp,
        ssm_dtype=shape.linear_ssm_dtype, ssm_cache_dtype=shape.linear_ssm_cache_dtype,
        gpu_family=gpu_family(gpu_name), gpu_memory_gib=gpu_memory / GIB,
        max_model_len=int(shape.max_context or 0),
        n_window=shape.n_window_layers if windows else 0,
        window=shape.window_tokens if windows else 0)


@lru_cache(maxsize=256)
def _layout(engine: str, hybrid: HybridShape | None, gpu_memory: float,
            state_bytes: float) -> StateLayout:
    e = engines.get(engine)
    if hybrid is not None and e.state_layout is not None:
        return e.state_layout(hybrid)
    return StateLayout(NO_STATE, state_bytes=state_bytes, unit_bytes=0.0,
                       default_running=e.default_running(gpu_memory / GIB))


def state_layout(engine: str, shape: ModelShape, tp: int, gpu_name: str,
                 gpu_memory: float) -> StateLayout:
    """How ``engine`` holds ``shape``'s state and KV on one of ``tp`` GPUs (memoised):
    its own planner's layout for a hybrid, else no state pool (a model without
    linear-attention layers, or an engine without a planner: then the state is costed per
    sequence, not pooled)."""
    state = (shape.state_bytes_per_seq - shape.window_bytes_per_seq) / tp
    return _layout(engine, hybrid_shape(shape, tp, gpu_name, gpu_memory), gpu_memory, state)


@dataclass(frozen=True)
class MemoryChoice:
    fraction: float
    reason: str


def choose_fraction(engine: str, gpu: str, safe: list[float], unsafe: list[float]) -> MemoryChoice:
    """The highest fraction seen safe below the lowest fraction seen to OOM."""
    ceiling = min(unsafe) if unsafe else OOM_THRESHOLD
    ok = [f for f in safe if f < ceiling]
    if ok:
        best = max(ok)
        why = (f"{best:.2f} is the highest memory fraction that ran without OOM for {engine} "
               f"on {gpu}")
        if unsafe:
            why += f"; {', '.join(f'{f:.2f}' for f in unsafe)} gave out-of-memory retries"
        return MemoryChoice(best, why)
    frac = min(DEFAULT_FRACTION, round(ceiling - 0.03, 2))
    why = (f"no safe memory fraction calibrated for {engine} on {gpu}; using {frac:.2f}, "
           f"below the {ceiling:.2f} at which out-of-memory retries "
           f"{'were seen' if unsafe else 'are reported'}")
    return MemoryChoice(frac, why)
