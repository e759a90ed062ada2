"""Memory fraction, KV capacity and how many sequences run at once (engine documentation).

Each engine's memory flag says what its fraction covers (``model.engines``: ``mem_flag``,
``mem_covers``; vLLM's ``--gpu-memory-utilization`` budgets the whole instance, SGLang's
``--mem-fraction-static`` weights + KV pool). Per GPU:
``KV budget = fraction x memory - weights / tp - Engine.reserve(activation peak)`` and
``capacity = budget / (KV bytes per token per GPU / dcp)``; linear-attention state is held per
running sequence. When a batch does not fit, the engine runs what fits and admits the rest as
running sequences finish (``model.formulas.rows_into``); the simulator's scheduler admits
requests by the same capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from model import engines
from model.formulas import DEFAULT_MAX_RUNNING, kv_capacity

if TYPE_CHECKING:
    from model.physics.shape import ModelShape

DEFAULT_FRACTION = 0.90          # used when calibration says nothing about this engine and GPU
OOM_THRESHOLD = 0.95             # published: 0.95 gave OOM retries on B300 for both engines
GIB = 2 ** 30
# What an engine's memory fraction spends outside weights and KV (its reserve, and whether its
# budget holds the activation peak) is the engine's: model/engines/<engine>.py, read off the
# real start-up logs on one H200 (bench/data/h200-real/logs).
PROFILE_SEQS = 1024              # vLLM's max_num_seqs on an H200: the sampler's profiled rows
PROFILE_TOKENS = 8192            # its max_num_batched_tokens: the profiled forward pass


def activation_peak_bytes(summary: dict | None, tp: int) -> float:
    """vLLM's profiled activation peak per GPU: the sampler's fp32 logits of PROFILE_SEQS rows,
    plus one PROFILE_TOKENS-token pass's largest bf16 intermediate per token (the fused MoE's
    three caches of top-k x max(2 x expert intermediate / tp, hidden), or a dense MLP's gate
    and up projections and hidden state). On our H200 it gives 1.16 GiB for deepseek-v2-lite
    (1.09 logged) and 0.99 GiB for llama-3.1-8b (1.1 logged). Without an architecture: 1.1 GiB."""
    if not summary or not summary.get("hidden_size"):
        return 1.1 * GIB
    h = float(summary["hidden_size"])
    sampler = PROFILE_SEQS * float(summary.get("vocab_size") or 0) * 4.0
    dense = 2.0 * float(summary.get("dense_intermediate") or 0) / tp + 2.0 * h
    moe = 0.0
    if summary.get("n_moe_layers"):
        moe = 3.0 * float(summary["experts_per_token"]) * max(
            2.0 * float(summary["expert_intermediate"]) / tp, h)
    return sampler + PROFILE_TOKENS * 2.0 * max(dense, moe)
# Both engines preallocate the linear-attention state for DEFAULT_MAX_RUNNING sequences (or the
# batch when it is larger; model.formulas.max_running). For Kimi-K3 at TP 8 that is 256 x 56 MB
# = 14.4 GB per GPU: vLLM's published 25.12 GiB of KV on an 8-GPU GB300 node (vllm#50055) is
# what remains after it.


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


def kv_capacity_tokens(engine: str, fraction: float, gpu_memory: float, weight_bytes: float,
                       tp: int, kv_bytes_per_gpu_token: float, dcp: int,
                       state_pool_bytes: float = 0.0, activation_bytes: float = 0.0) -> int:
    """Tokens of KV one instance holds (``kv_capacity`` of one configuration, an int)."""
    return int(kv_capacity(engines.get(engine).reserve(activation_bytes), float(fraction),
                           float(gpu_memory),
                           float(weight_bytes), float(tp), float(kv_bytes_per_gpu_token),
                           float(dcp), float(state_pool_bytes)))


def state_pool_bytes(shape: ModelShape, tp: int, max_running: int) -> float:
    """Bytes per GPU of the linear-attention state an engine preallocates for
    ``max_running`` sequences (``model.physics.terms.Physics`` packs the same per-sequence
    share)."""
    return shape.state_bytes_per_seq / float(tp) * float(max_running)


def instance_kv_capacity(engine: str, fraction: float, gpu_memory: float, shape: ModelShape,
                         tp: int, dcp: int, max_running: int = DEFAULT_MAX_RUNNING) -> int:
    """Tokens of KV one instance of ``engine`` holds for the served model ``shape`` on ``tp``
    GPUs of ``gpu_memory`` bytes at DCP ``dcp``, launched for ``max_running`` sequences: the
    capacity the recommender predicts with (``model.formulas.kv_capacity``, weights, the
    engine's reserve with the model's activation peak where its budget holds it, and the
    state pool subtracted) and the simulator admits by."""
    return kv_capacity_tokens(engine, fraction, gpu_memory, shape.weight_bytes, tp,
                              shape.kv_gpu_token_bytes(tp), dcp,
                              state_pool_bytes(shape, tp, max_running),
                              activation_peak_bytes(shape.summary, tp))
