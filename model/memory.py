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
from typing import TYPE_CHECKING

from model.formulas import DEFAULT_MAX_RUNNING, kv_capacity

if TYPE_CHECKING:
    from model.shape import ModelShape

MEM_FLAGS = {"vllm": "--gpu-memory-utilization", "sglang": "--mem-fraction-static"}
DEFAULT_FRACTION = 0.90          # used when calibration says nothing about this engine and GPU
OOM_THRESHOLD = 0.95             # published: 0.95 gave OOM retries on B300 for both engines
# Share of GPU memory vLLM's budget spends outside weights + KV (activation peak of a chunked-
# prefill pass and CUDA graphs); SGLang keeps these outside its static fraction.
ENGINE_RESERVE = {"vllm": 0.08, "sglang": 0.0}
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


def engine_reserve(engine: str) -> float:
    """ENGINE_RESERVE of an engine name (0 for an engine without one)."""
    return ENGINE_RESERVE.get(engine, 0.0)


def kv_capacity_tokens(engine: str, fraction: float, gpu_memory: float, weight_bytes: float,
                       tp: int, kv_bytes_per_gpu_token: float, dcp: int,
                       state_pool_bytes: float = 0.0) -> int:
    """Tokens of KV one instance holds (``kv_capacity`` of one configuration, an int)."""
    return int(kv_capacity(engine_reserve(engine), float(fraction), float(gpu_memory),
                           float(weight_bytes), float(tp), float(kv_bytes_per_gpu_token),
                           float(dcp), float(state_pool_bytes)))


def state_pool_bytes(shape: ModelShape, tp: int, max_running: int) -> float:
    """Bytes per GPU of the linear-attention state an engine preallocates for
    ``max_running`` sequences (``model.terms.Physics`` packs the same per-sequence share)."""
    return shape.state_bytes_per_seq / float(tp) * float(max_running)


def instance_kv_capacity(engine: str, fraction: float, gpu_memory: float, shape: ModelShape,
                         tp: int, dcp: int, max_running: int = DEFAULT_MAX_RUNNING) -> int:
    """Tokens of KV one instance of ``engine`` holds for the served model ``shape`` on ``tp``
    GPUs of ``gpu_memory`` bytes at DCP ``dcp``, launched for ``max_running`` sequences: the
    capacity the recommender predicts with (``model.formulas.kv_capacity``, weights, the
    engine's reserve and the state pool subtracted) and the simulator admits by."""
    return kv_capacity_tokens(engine, fraction, gpu_memory, shape.weight_bytes, tp,
                              shape.kv_gpu_token_bytes(tp), dcp,
                              state_pool_bytes(shape, tp, max_running))


def kv_demand_tokens(batch, context, output, share=0.0):
    """KV tokens a whole batch holds when all of it runs at once (shared prefix once)."""
    shared = share * context
    return shared + batch * (context - shared + output)
