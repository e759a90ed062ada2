"""A decision as the contract's ``Recommendation``: the choice, every prediction ranked, the
reasons, the memory fraction with its flag and the launch command."""

from __future__ import annotations

from engine_advisor.model import engines
from engine_advisor.model.decision.choose import Decision
from engine_advisor.model.physics.memory import MemoryChoice
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.presentation.launch import launch_command
from engine_advisor.model.presentation.reasons import reasons
from engine_advisor.model.schemas import ConfigRef, Recommendation, constructor
from engine_advisor.model.workload import Workload


def answer(w: Workload, shape: ModelShape, gpu: str, d: Decision, mem: MemoryChoice,
           provenance: str, version: str) -> Recommendation:
    """The ``Recommendation`` of decision ``d``; ``mem``: the chosen engine's memory choice,
    ``provenance``: where the GPU's physics came from."""
    best, rival = d.best, d.rival
    bp = best.pred
    engine = best.config.engine
    why = reasons(w, shape, gpu, d, provenance)
    why.append(mem.reason)
    return make_recommendation({
        "engine": engine, "dcp_size": best.config.dcp_size,
        "mem_fraction": bp.mem_fraction, "mem_fraction_flag": engines.get(engine).mem_flag,
        "predictions": [e.pred for e in d.ranked],
        "speedup": d.speedup,
        "speedup_over": make_ref({"engine": rival.config.engine,
                                  "dcp_size": rival.config.dcp_size}) if rival else None,
        "confidence": d.confidence,
        "crossover_context_tokens": d.crossover,
        "kv_capacity_tokens": bp.kv_capacity_tokens, "fits_in_memory": bp.fits_in_memory,
        "launch_command": launch_command(engine, best.config.dcp_size, bp.mem_fraction, w,
                                         bp.memory_flags),
        "reasons": why, "excluded": d.excluded, "model_version": version})


make_recommendation = constructor(Recommendation)
make_ref = constructor(ConfigRef)
