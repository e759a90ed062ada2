"""Why a workload's model does not fit the hardware, with the numbers, and what would fit.

Called when no candidate configuration holds even one sequence. The cause is either the weights
(with one sequence's linear-attention state) filling the memory an engine may use on each GPU, or
one sequence's KV exceeding what is left. Every suggestion is checked with the recommender's own
memory (``engine_advisor.model.physics.capacity``: each engine's pool, its knobs chosen for the
sequence as a recommendation chooses them) before it is offered: more GPUs, a quantized checkpoint,
a higher memory fraction, an fp8 KV cache, a shorter sequence; none repeats a setting the workload
already has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from engine_advisor.model import engines
from engine_advisor.model.physics.capacity import instance_fit, instance_pool
from engine_advisor.model.physics.memory import OOM_THRESHOLD, activation_peak_bytes
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.workload import MAX_GPUS, Workload

GB = 1e9
# (name, bytes per parameter) of the checkpoints suggested when the weights are too large,
# tried in order: each only when the checkpoint's own bytes per parameter are clearly above
QUANTIZED = (("an fp8", 1.0), ("a 4-bit (MXFP4, NVFP4, AWQ or GPTQ)", 0.5))
FRACTION_STEP = 0.01

DcpsFor = Callable[[str, int], list[int]]     # (engine, GPUs) -> the DCP sizes it may run


@dataclasses.dataclass(frozen=True)
class NoFit:
    """The explanation: the message and the workload field to blame (``num_gpus`` when the
    weights do not fit, ``context_tokens`` when one sequence's KV does not)."""

    message: str
    field: str


def best_capacity(w: Workload, shape: ModelShape, fractions: dict[str, float],
                  dcps_for: DcpsFor, num_gpus: int | None = None
                  ) -> tuple[int, str, int]:
    """(KV tokens, engine, DCP size) of the configuration holding the most KV (each engine's
    reported capacity, ``engine_advisor.model.physics.capacity.Pool.capacity_tokens``)."""
    n = num_gpus or w.num_gpus
    gpu = w.gpu_spec()
    return max(((instance_pool(e, f, gpu, shape, n, d).capacity_tokens, e, d)
                for e, f in fractions.items() for d in dcps_for(e, n)), default=(0, "", 1))


def _holds(w: Workload, shape: ModelShape, fractions: dict[str, float], dcps_for: DcpsFor,
           num_gpus: int | None = None) -> bool:
    """Whether some configuration holds one sequence of the workload."""
    n = num_gpus or w.num_gpus
    gpu = w.gpu_spec()
    return any(instance_fit(e, f, gpu, shape, n, d, 1, w.context_tokens, w.output_tokens,
                            advise=True).fits_one
               for e, f in fractions.items() for d in dcps_for(e, n))


def explain(w: Workload, shape: ModelShape, fractions: dict[str, float],
            dcps_for: DcpsFor) -> NoFit:
    """Why no configuration of ``fractions``' engines (each at its memory fraction) holds one
    sequence of the workload, and what would."""
    gpu = w.gpu_spec()
    n, mem = w.num_gpus, gpu.memory_bytes
    weights = shape.weight_bytes / n
    pool = shape.state_bytes_per_seq / n         # one sequence's state (and windows)
    act = activation_peak_bytes(shape.summary, n)
    reserve = {e: engines.get(e).reserve(act) for e in fractions}
    usable = {e: f * mem - reserve[e] for e, f in fractions.items()}
    head = f"the model does not fit on {gpu.name} x {n}: "
    state = (f" and {pool / GB:.2f} GB of linear-attention state for one sequence"
             if pool > 0 else "")
    if all(weights + pool >= u for u in usable.values()):
        field = "num_gpus"
        parts = [f"{e} {u / GB:.1f} GB ({_flag(e)} {fractions[e]:.2f} x "
                 f"{mem / GB:.1f} GB"
                 + (f" less its {reserve[e] / GB:.1f} GB reserve" if reserve[e] else "")
                 + ")" for e, u in usable.items()]
        gpus = f"{n} GPUs" if n > 1 else "1 GPU"
        cause = (f"its weights take {weights / GB:.1f} GB per GPU ({shape.weight_bytes / GB:.1f} "
                 f"GB over {gpus}){state}, more than the memory an engine may use: "
                 + "; ".join(parts))
    else:
        field = "context_tokens"
        cap, engine, dcp = best_capacity(w, shape, fractions, dcps_for)
        per_token = shape.kv_gpu_token_bytes(n) / dcp
        seq = w.context_tokens + w.output_tokens
        left = usable[engine] - weights - pool
        cause = (f"one sequence of {seq:,} tokens ({w.context_tokens:,} + {w.output_tokens:,}) "
                 f"needs {seq * per_token / GB:.2f} GB of KV per GPU ({per_token:,.0f} B per "
                 f"token per GPU with {engine} dcp {dcp}, the largest capacity), and "
                 f"{max(left, 0.0) / GB:.2f} GB is left after {weights / GB:.1f} GB of "
                 f"weights per GPU{state} ({_flag(engine)} "
                 f"{fractions[engine]:.2f}): "
                 f"{cap:,} tokens")
    fixes = suggestions(w, shape, fractions, dcps_for)
    tail = ("; it would fit with " + ", or ".join(fixes)) if fixes else (
        "; none of more GPUs, a quantized checkpoint, a higher memory fraction or an fp8 KV "
        "cache would hold it")
    return NoFit(head + cause + tail, field)


def suggestions(w: Workload, shape: ModelShape, fractions: dict[str, float],
                dcps_for: DcpsFor) -> list[str]:
    """What would hold one sequence, each checked with the capacity function."""
    out = []
    n = w.num_gpus
    m = 2 * n
    while m <= MAX_GPUS:
        if _holds(w, shape, fractions, dcps_for, m):
            out.append(f"num_gpus {m} ({m} x {w.gpu_spec().name})")
            break
        m *= 2
    params = float(shape.summary.get("total_params") or 0.0)
    if params > 0:
        have = shape.weight_bytes / params
        for name, per_param in QUANTIZED:
            if have > 1.2 * per_param and _holds(
                    w, dataclasses.replace(shape, weight_bytes=params * per_param), fractions,
                    dcps_for):
                out.append(f"{name} checkpoint (about {params * per_param / GB:.0f} GB of "
                           f"weights instead of {shape.weight_bytes / GB:.0f} GB)")
                break
    higher = _higher_fraction(w, shape, fractions, dcps_for)
    if higher:
        out.append(higher)
    if w.kv_cache_dtype != "fp8" and w.kv_bytes_per_token is None:
        fp8 = w.model_copy(update={"kv_cache_dtype": "fp8"})
        if _holds(w, fp8.model_shape(), fractions, dcps_for):
            out.append("kv_cache_dtype fp8 (half the KV bytes per token)")
    cap = best_capacity(w, shape, fractions, dcps_for)[0]
    if cap > 0:
        out.append(f"a sequence of at most {cap:,} tokens (context_tokens + output_tokens)")
    return out


def _flag(engine: str) -> str:
    """How the fractions here are named for ``engine``: its memory flag where the flag is a
    share of the whole GPU, else "memory fraction" (TensorRT-LLM's flag is a share of the
    free memory: the launch command converts it)."""
    e = engines.get(engine)
    return e.mem_flag if e.flag_fraction is None else "memory fraction"


def _higher_fraction(w: Workload, shape: ModelShape, fractions: dict[str, float],
                     dcps_for: DcpsFor) -> str | None:
    """The lowest memory fraction above an engine's own, below the published OOM point, at
    which it would hold one sequence."""
    found = []
    for e, f in fractions.items():
        k = 1
        while (g := round(f + k * FRACTION_STEP, 2)) < OOM_THRESHOLD:
            if _holds(w, shape, {e: g}, dcps_for):
                found.append((g, e, f))
                break
            k += 1
    if not found:
        return None
    g, e, f = min(found)
    return (f"{e} at {_flag(e)} {g:.2f} instead of the chosen {f:.2f} "
            f"(out-of-memory retries were published at {OOM_THRESHOLD:.2f})")
