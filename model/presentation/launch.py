"""The launch command of a recommendation: the engine's own command line for the workload."""

from __future__ import annotations

from model import engines
from model.formulas import DEFAULT_MAX_RUNNING
from model.workload import Workload


def launch_command(engine: str, dcp: int, fraction: float, w: Workload) -> list[str]:
    """``engine``'s command line for the workload's model on its GPUs
    (``model.engines.base.Engine.launch_command``), launched for the whole batch when it
    exceeds the engines' default of DEFAULT_MAX_RUNNING running sequences."""
    big = w.batch_size if w.batch_size > DEFAULT_MAX_RUNNING else None
    return engines.get(engine).launch_command(w.model or "MODEL", w.num_gpus, dcp, fraction,
                                              big, w.kv_cache_dtype)
