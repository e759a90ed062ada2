"""Memory fraction and KV capacity per engine (reference.md section 2).

vLLM's ``--gpu-memory-utilization`` budgets the whole instance (weights, activations, KV, CUDA
graphs); SGLang's ``--mem-fraction-static`` covers weights + KV pool, activations live outside.
"""

from __future__ import annotations

from dataclasses import dataclass

MEM_FLAGS = {"vllm": "--gpu-memory-utilization", "sglang": "--mem-fraction-static"}
DEFAULT_FRACTION = 0.90          # used when calibration says nothing about this engine and GPU
OOM_THRESHOLD = 0.95             # published: 0.95 gave OOM retries on B300 for both engines
VLLM_ACTIVATION_RESERVE = 0.03   # share of GPU memory vLLM's budget spends outside weights + KV


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


def kv_capacity_tokens(engine: str, fraction: float, gpu_memory: float, weight_bytes: float | None,
                       num_gpus: int, kv_bytes_per_gpu_token: float, dcp: int) -> int:
    """Tokens of KV one instance holds; weights unknown count as zero (an upper bound)."""
    budget = fraction * gpu_memory - (weight_bytes or 0.0) / num_gpus
    if engine == "vllm":
        budget -= VLLM_ACTIVATION_RESERVE * gpu_memory
    if budget <= 0:
        return 0
    return int(budget / (kv_bytes_per_gpu_token / dcp))
