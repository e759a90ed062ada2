"""Memory fraction, KV capacity and how many sequences run at once (engine documentation).

vLLM's ``--gpu-memory-utilization`` budgets the whole instance (weights, activations, CUDA
graphs, KV); SGLang's ``--mem-fraction-static`` covers weights + KV pool, activations live
outside it. Per GPU: ``KV budget = fraction x memory - weights / tp - reserve(engine)`` and
``capacity = budget / (KV bytes per token per GPU / dcp)``; linear-attention state is held per
running sequence. When a batch does not fit, the engine runs what fits and queues the rest
(``waves``); the simulator's scheduler admits requests by the same capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.ew import clip, floor, maximum, where

MEM_FLAGS = {"vllm": "--gpu-memory-utilization", "sglang": "--mem-fraction-static"}
DEFAULT_FRACTION = 0.90          # used when calibration says nothing about this engine and GPU
OOM_THRESHOLD = 0.95             # published: 0.95 gave OOM retries on B300 for both engines
# Share of GPU memory vLLM's budget spends outside weights + KV (activation peak of a chunked-
# prefill pass and CUDA graphs); SGLang keeps these outside its static fraction.
ENGINE_RESERVE = {"vllm": 0.08, "sglang": 0.0}
# Both engines preallocate the constant per-sequence state of linear-attention layers (vLLM's
# mamba/KDA state cache, SGLang's state pool) for their maximum running sequences: 256 by
# default (--max-num-seqs / --max-running-requests), or the batch when it is set higher. For
# Kimi-K3 at TP 8 that is 256 x 56 MB = 14.4 GB per GPU: vLLM's published 25.12 GiB of KV on an
# 8-GPU GB300 node (vllm#50055) is what remains after it.
DEFAULT_MAX_RUNNING = 256


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


def max_running(batch):
    """The running-sequence limit an engine is launched with for a batch (the state pool)."""
    return maximum(float(DEFAULT_MAX_RUNNING), floor(batch))


def engine_reserve(engine):
    """ENGINE_RESERVE of an engine name (a float) or of an array of names (an array)."""
    if not isinstance(engine, np.ndarray):
        return ENGINE_RESERVE.get(engine, 0.0)
    reserve = np.zeros(engine.shape)
    for e, r in ENGINE_RESERVE.items():
        if r:
            reserve[engine == e] = r
    return reserve


def kv_budget_bytes(engine, fraction, gpu_memory: float, weight_bytes: float, tp: int,
                    state_pool_bytes=0.0):
    """Bytes per GPU left for the KV cache after weights, the engine's reserve and the
    preallocated linear-attention state pool (floats, or arrays broadcast; engine: a name or
    an array of names)."""
    return ((fraction - engine_reserve(engine)) * gpu_memory - weight_bytes / tp
            - state_pool_bytes)


def kv_capacity(engine, fraction, gpu_memory: float, weight_bytes: float, tp: int,
                kv_bytes_per_gpu_token: float, dcp, state_pool_bytes=0.0):
    """Tokens of KV one instance holds (floats or arrays; weights of 0 give an upper bound)."""
    budget = kv_budget_bytes(engine, fraction, gpu_memory, weight_bytes, tp, state_pool_bytes)
    if kv_bytes_per_gpu_token <= 0:
        return where(budget > 0, float(2 ** 62), 0.0)
    return where(budget > 0, floor(maximum(budget, 0.0) / (kv_bytes_per_gpu_token / dcp)), 0.0)


def kv_capacity_tokens(engine: str, fraction: float, gpu_memory: float, weight_bytes: float,
                       tp: int, kv_bytes_per_gpu_token: float, dcp: int,
                       state_pool_bytes: float = 0.0) -> int:
    """Tokens of KV one instance holds (``kv_capacity`` of one configuration, an int)."""
    return int(kv_capacity(engine, float(fraction), gpu_memory, weight_bytes, tp,
                           kv_bytes_per_gpu_token, float(dcp), float(state_pool_bytes)))


def sequences_at_once(capacity_tokens, batch, context, output, share=0.0):
    """How many of ``batch`` sequences fit at once: each holds its uncached prompt and its
    output; a cached shared prefix is held once (their state lives in the preallocated pool).
    Floats or arrays."""
    shared = share * context
    per_seq = context - shared + output
    fit = floor((capacity_tokens - shared) / maximum(per_seq, 1.0))
    return clip(fit, 0.0, batch)


def kv_demand_tokens(batch, context, output, share=0.0):
    """KV tokens a whole batch holds when all of it runs at once (shared prefix once)."""
    shared = share * context
    return shared + batch * (context - shared + output)
