"""A decision as the contract's ``Recommendation``: the choice, every prediction ranked, the
reasons, the memory fraction with its flag and the launch command."""

from __future__ import annotations

from engine_advisor.model import engines
from engine_advisor.model.decision.choose import Decision
from engine_advisor.model.physics.memory import MemoryChoice
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.presentation.launch import (
    config_file,
    flag_value,
    launch_command,
    memory_reason,
)
from engine_advisor.model.presentation.reasons import reasons
from engine_advisor.model.schemas import ConfigRef, Recommendation, constructor
from engine_advisor.model.workload import Workload


def answer(w: Workload, shape: ModelShape, gpu: str, d: Decision, mem: MemoryChoice,
           provenance: str, version: str, moe_notes: dict[str, str]) -> Recommendation:
    """The ``Recommendation`` of decision ``d``; ``mem``: the chosen engine's memory choice,
    ``provenance``: where the GPU's physics came from, ``moe_notes``: per engine, why its
    fused-MoE kernel for the model's experts runs slower than its reference."""
    best, rival = d.best, d.rival
    bp = best.pred
    engine = best.config.engine
    dcp = best.config.dcp_size
    why = reasons(w, shape, gpu, d, provenance, moe_notes)
    why.append(mem.reason)
    why += engine_notes(w, shape, d)
    return make_recommendation({
        "engine": engine, "dcp_size": dcp,
        "mem_fraction": bp.mem_fraction, "mem_fraction_flag": engines.get(engine).mem_flag,
        "mem_flag_value": flag_value(engine, bp.mem_fraction, w, shape, bp.memory_flags),
        "config_file": config_file(engine, dcp, bp.mem_fraction, w, bp.memory_flags, shape),
        "predictions": [e.pred for e in d.ranked],
        "speedup": d.speedup,
        "speedup_over": make_ref({"engine": rival.config.engine,
                                  "dcp_size": rival.config.dcp_size}) if rival else None,
        "confidence": d.confidence,
        "crossover_context_tokens": d.crossover,
        "kv_capacity_tokens": bp.kv_capacity_tokens, "fits_in_memory": bp.fits_in_memory,
        "launch_command": launch_command(engine, dcp, bp.mem_fraction, w, bp.memory_flags,
                                         shape),
        "reasons": why, "excluded": d.excluded, "model_version": version})


def engine_notes(w: Workload, shape: ModelShape, d: Decision) -> list[str]:
    """What the chosen engine's memory flag means where it is not a share of the whole GPU,
    and, for every engine ranked whose record says so, why its predictions are uncalibrated
    and what its DCP > 1 is (TensorRT-LLM: no calibration data, Helix experimental)."""
    best = d.best
    out = []
    memory = memory_reason(best.config.engine, best.pred.mem_fraction, w, shape,
                           best.pred.memory_flags)
    if memory:
        out.append(memory)
    # one pass over the ranking: per engine in rank order, its first calibration note and
    # whether a DCP > 1 of it is ranked (vLLM and SGLang have neither note: nothing to add)
    notes: dict[str, list] = {}
    for x in d.ranked:
        c, p = x.config, x.pred
        seen = notes.get(c.engine)
        if seen is None:
            seen = notes[c.engine] = [None, False]
        if seen[0] is None and p.calibration_note:
            seen[0] = p.calibration_note
        if c.dcp_size > 1:
            seen[1] = True
    for name, (note, dcp) in notes.items():
        if note:
            out.append(f"{name} calibrated: false: {note}")
        dcp_note = engines.get(name).dcp_note
        if dcp and dcp_note:
            out.append(f"{name} dcp > 1: {dcp_note}")
    return out


make_recommendation = constructor(Recommendation)
make_ref = constructor(ConfigRef)
