"""The launch command of a recommendation: the engine's own command line for the workload, its
memory flag's value (for engines whose flag is not a share of the whole GPU, TensorRT-LLM's) and
its configuration file."""

from __future__ import annotations

from collections.abc import Sequence

from engine_advisor.model import engines
from engine_advisor.model.physics.memory import activation_peak_bytes
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.schemas import ConfigFile
from engine_advisor.model.workload import Workload

GB = 1e9


def used_before_kv(engine: str, w: Workload, shape: ModelShape | None,
                   memory_flags: Sequence[str] = ()) -> float:
    """Bytes per GPU ``engine`` holds before its KV cache on the workload's GPUs, as the cost
    model counts them (``engine_advisor.model.formulas.memory.kv_budget``): the weights' share,
    the engine's reserve and, where its budget holds it, the activation peak it profiles at its
    running-request limit (the one in ``memory_flags``, else its default)."""
    if shape is None:
        return 0.0
    e = engines.get(engine)
    n, mem = w.num_gpus, w.gpu_spec().memory_bytes
    flags = list(memory_flags)
    running = (int(flags[flags.index(e.max_running_flag) + 1])
               if e.max_running_flag in flags[:-1] else e.default_running(mem / 2 ** 30))
    act = activation_peak_bytes(shape.summary, n, running) if e.counts_activations else 0.0
    return shape.weight_bytes / n + e.reserve(act)


def flag_value(engine: str, fraction: float, w: Workload, shape: ModelShape | None,
               memory_flags: Sequence[str] = ()) -> float:
    """The value of ``engine``'s memory flag for ``fraction`` of the whole GPU
    (``engine_advisor.model.engines.base.Engine.flag_value``), rounded as the command writes it:
    the fraction itself for vLLM and SGLang, TensorRT-LLM's share of the free memory."""
    e = engines.get(engine)
    if e.flag_fraction is None or shape is None:
        return fraction
    return round(e.flag_value(fraction, w.gpu_spec().memory_bytes,
                              used_before_kv(engine, w, shape, memory_flags)), 2)


def launch_command(engine: str, dcp: int, fraction: float, w: Workload,
                   memory_flags: Sequence[str] = (), shape: ModelShape | None = None
                   ) -> list[str]:
    """``engine``'s command line for the workload's model on its GPUs
    (``engine_advisor.model.engines.base.Engine.launch_command``), with the memory knobs its
    prediction assumes (``ConfigPrediction.memory_flags``: the running-request limit when the batch
    exceeds the engine's default, a hybrid's state and KV split) and its memory flag's value for
    ``fraction`` of the whole GPU (``flag_value``: with the model's ``shape``)."""
    value = flag_value(engine, fraction, w, shape, memory_flags)
    return engines.get(engine).launch_command(w.model or "MODEL", w.num_gpus, dcp, value,
                                              memory_flags, w.kv_cache_dtype)


def config_file(engine: str, dcp: int, fraction: float, w: Workload,
                memory_flags: Sequence[str] = (), shape: ModelShape | None = None
                ) -> ConfigFile | None:
    """The configuration file ``engine``'s launch command names (``--config`` of
    TensorRT-LLM), or None for an engine without one."""
    e = engines.get(engine)
    value = flag_value(engine, fraction, w, shape, memory_flags)
    text = e.config_text(dcp, value, w.kv_cache_dtype)
    if text is None:
        return None
    return ConfigFile(path=e.config_path, content=text)


def memory_reason(engine: str, fraction: float, w: Workload, shape: ModelShape | None,
                  memory_flags: Sequence[str] = ()) -> str | None:
    """What the engine's memory flag means where it is not a share of the whole GPU: the
    fraction converted to the engine's own (None for vLLM and SGLang)."""
    e = engines.get(engine)
    if e.flag_fraction is None or shape is None:
        return None
    mem = w.gpu_spec().memory_bytes
    used = used_before_kv(engine, w, shape, memory_flags)
    value = flag_value(engine, fraction, w, shape, memory_flags)
    weights = shape.weight_bytes / w.num_gpus
    return (f"{e.label}'s {e.mem_flag} is a share of the memory free after the weights, "
            f"activations and buffers, not of the whole GPU: memory fraction {fraction:.2f} of "
            f"the GPU ({fraction * mem / GB:.1f} of {mem / GB:.1f} GB) = {value:.2f} of the "
            f"{max(mem - used, 0.0) / GB:.1f} GB free after {weights / GB:.1f} GB of weights "
            f"and {(used - weights) / GB:.1f} GB of activations and buffers per GPU (the "
            "buffers a prior: no start-up log of it was read)")
