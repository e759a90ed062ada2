"""The launch command of a recommendation: the engine's own command line for the workload."""

from __future__ import annotations

from collections.abc import Sequence

from engine_advisor.model import engines
from engine_advisor.model.workload import Workload


def launch_command(engine: str, dcp: int, fraction: float, w: Workload,
                   memory_flags: Sequence[str] = ()) -> list[str]:
    """``engine``'s command line for the workload's model on its GPUs
    (``engine_advisor.model.engines.base.Engine.launch_command``), with the memory knobs its
    prediction assumes (``ConfigPrediction.memory_flags``: the running-request limit when the batch
    exceeds the engine's default, a hybrid's state and KV split)."""
    return engines.get(engine).launch_command(w.model or "MODEL", w.num_gpus, dcp, fraction,
                                              memory_flags, w.kv_cache_dtype)
