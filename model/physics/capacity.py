"""The memory of one engine instance, outside a recommendation's rows: what the simulator admits by
and what ``engine_advisor.model.decision.nofit`` checks its suggestions with. Both call the compiled
functions the recommender predicts with (``engine_advisor.model.formulas.memory.pool_of``,
``memory_fit``) on one row (``engine_advisor.model.physics.features.static_rows``): one
implementation of each engine's memory.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from engine_advisor.model.engines.base import DEFAULT_KNOBS, MemoryKnobs, knobs_of
from engine_advisor.model.formulas.memory import (
    LIMIT_KV,
    LIMIT_NONE,
    LIMIT_RUNNING,
    LIMIT_STATE,
    memory_fit,
    pool_of,
)
from engine_advisor.model.hardware.gpus import GpuSpec
from engine_advisor.model.hardware.silicon import silicon_for
from engine_advisor.model.physics.features import engine_index, static_rows
from engine_advisor.model.physics.memory import StateLayout, state_layout
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.physics.terms import physics_for

LIMIT_NAMES = {LIMIT_NONE: "none", LIMIT_KV: "kv", LIMIT_STATE: "state",
               LIMIT_RUNNING: "max_running"}


class Pool(NamedTuple):
    """One instance's memory as its engine admits requests into it: a request of ``n`` tokens
    (prompt and planned output) takes ``attn_units x ceil(n / unit_tokens) + fixed_units`` of
    ``units``, and at most ``max_running`` run. ``capacity_tokens`` is what the engine reports
    (its log's KV size), ``state_slots`` SGLang's state pool (0 elsewhere)."""

    units: float
    unit_tokens: float
    attn_units: float
    fixed_units: float
    max_running: int
    capacity_tokens: int
    state_slots: int
    layout: StateLayout

    def units_for(self, tokens: float) -> float:
        """Units one request of ``tokens`` takes."""
        return self.attn_units * math.ceil(tokens / self.unit_tokens) + self.fixed_units

    def holds(self, tokens: float) -> bool:
        """Whether one request of ``tokens`` could ever run (alone in the pool)."""
        return self.max_running >= 1 and self.units_for(tokens) <= self.units


class Fit(NamedTuple):
    """How a batch sits in one instance (``engine_advisor.model.formulas.memory.memory_fit``)."""

    running: int               # sequences at once
    capacity_tokens: int
    fits_one: bool
    fits_all: bool             # the memory holds the whole batch
    limit: str                 # what binds: none, kv, state, max_running
    knobs: MemoryKnobs         # as launched, or chosen for the batch


def _row(engine: str, fraction: float, gpu: GpuSpec, shape: ModelShape, tp: int, dcp: int,
         knobs: MemoryKnobs, advise: bool):
    ph = physics_for(shape, silicon_for(gpu).for_engine(engine), tp)
    rows = static_rows(engine_index([engine]), fraction, float(dcp), shape, tp, gpu.name,
                       gpu.memory_bytes, knobs, advise)
    return ph.K, rows


def instance_pool(engine: str, fraction: float, gpu: GpuSpec, shape: ModelShape, tp: int,
                  dcp: int, knobs: MemoryKnobs = DEFAULT_KNOBS) -> Pool:
    """The memory of one instance of ``engine`` serving ``shape`` on ``tp`` GPUs at DCP
    ``dcp`` and memory fraction ``fraction``, launched with ``knobs``."""
    K, rows = _row(engine, fraction, gpu, shape, tp, dcp, knobs, False)
    units, unit, attn, fixed, limit, cap, slots, _ = pool_of(
        K, rows, 0, float(dcp), float(knobs.max_running), float(knobs.state_slots),
        bool(knobs.no_prefix_cache))
    return Pool(max(units, 0.0), unit, attn, fixed, int(limit), int(cap), int(slots),
                state_layout(engine, shape, tp, gpu.name, gpu.memory_bytes))


def instance_fit(engine: str, fraction: float, gpu: GpuSpec, shape: ModelShape, tp: int,
                 dcp: int, batch: int, context: int, output: int, share: float = 0.0,
                 knobs: MemoryKnobs = DEFAULT_KNOBS, advise: bool = False) -> Fit:
    """How ``batch`` sequences of ``context`` + ``output`` tokens sit in that instance, with
    ``knobs`` as launched or (``advise``) chosen for them as a recommendation does."""
    K, rows = _row(engine, fraction, gpu, shape, tp, dcp, knobs, advise)
    run, cap, one, every, bind, knob, shown, slots, *_ = memory_fit(
        K, rows, 0, float(batch), float(context), float(output), float(dcp), float(share))
    chosen = knobs_of(int(knob), int(shown), int(slots)) if knob else knobs
    return Fit(int(run), int(cap), one > 0.0, every > 0.0, LIMIT_NAMES[bind], chosen)
