"""A query as physics: the rows of a ``Case`` turned into the seconds of every physical term.

A ``Case`` is a set of rows that share the served model, the GPU type and the TP size: one workload
on several configurations, or one configuration over a grid of contexts. ``case_features`` is the
only place that builds features: prefill, decode steps, and the sequences running at once when the
batch's KV does not fit (``engine_advisor.model.formulas.rows.rows_into``). ``roofline_total_s``
is the same at spec-sheet peaks: the floor no measurement may beat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from engine_advisor.model import engines as engine_registry
from engine_advisor.model.engines.base import DEFAULT_KNOBS, SPLIT, MemoryKnobs
from engine_advisor.model.formulas.layout import (
    N_PREFILL,
    N_ROW_FIELDS,
    R_ADVISE,
    R_ATTN_UNITS,
    R_BLOCK,
    R_DEFAULT_RUNNING,
    R_MAX_RUNNING,
    R_MODE,
    R_NO_PREFIX,
    R_RATIO,
    R_REPORT_UNITS,
    R_SLOTS,
    R_STATE,
    R_STATE_UNITS,
    R_UNIT,
    fill_sizes,
)
from engine_advisor.model.formulas.memory import N_FACTS
from engine_advisor.model.formulas.rows import rows_into
from engine_advisor.model.hardware.silicon import Silicon, roofline_silicon
from engine_advisor.model.physics.memory import state_layout
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.physics.terms import PHYSICS_TERMS, TERMS, Physics, physics_for

N_TERMS = len(TERMS)


class QueryFacts(NamedTuple):
    """Per configuration of a query: engine, DCP size, memory fraction and (calibration status,
    calibrated range or None) (``CostModel.calibrated_range``); the compiled code's input rows that
    do not depend on the workload's sizes (``static_rows``) and each row's engine index
    (``engine_index``). Built and memoised by
    ``engine_advisor.model.predict.predictor.Predictor.facts``; read by
    ``engine_advisor.model.predict.query.Query``."""

    engines: list[str]
    dcps: list[float]
    max_dcp: float
    fractions: list[float]
    ranges: list[tuple[str, dict | None]]
    rows: np.ndarray
    engine_index: tuple[tuple[str, ...], np.ndarray]
    # per configuration, what its prediction reports that does not depend on the workload's sizes:
    # (engine, DCP size, calibrated, transferred, memory fraction, calibrated range or None, added
    # relative sd without calibration data) (``engine_advisor.model.predict.query.Query``)
    per_config: list[tuple]


@dataclass
class Case:
    """Rows sharing one served model, GPU type and TP size: one engine name per row; the other
    row fields are arrays or lists of that length, or one value for every row."""

    shape: ModelShape
    silicon: Silicon
    tp: int
    engine: np.ndarray | list  # engine names, one per row
    batch: np.ndarray | list
    context: np.ndarray | list
    output: np.ndarray | list
    dcp: np.ndarray | list
    fraction: np.ndarray | list  # memory fraction per row
    share: np.ndarray | list | float = 0.0   # prefix-cache share of each prompt
    physics: Physics | None = None     # physics_for(shape, silicon, tp), when the caller has it
    # routing diversity of a decode batch's tokens
    # (engine_advisor.model.formulas.terms.batch_terms): 1 for a trained router; below 1 for what
    # an engine measured on random weights (CostModel.diversity)
    diversity: np.ndarray | list | float = 1.0
    # the engines' memory knobs as launched, and whether to choose them for the workload (a
    # recommendation's rows: engine_advisor.model.formulas.memory.memory_fit)
    knobs: MemoryKnobs = DEFAULT_KNOBS
    advise: bool = False

    def __len__(self) -> int:
        return len(self.engine)

    def take(self, rows: np.ndarray, silicon: Silicon) -> Case:
        """The case's ``rows`` on ``silicon`` (``split_by_kernels``)."""
        def pick(v):
            return np.asarray(v)[rows] if np.ndim(v) else v
        return Case(self.shape, silicon, self.tp, pick(self.engine), pick(self.batch),
                    pick(self.context), pick(self.output), pick(self.dcp), pick(self.fraction),
                    pick(self.share), None, pick(self.diversity), self.knobs, self.advise)


@dataclass
class Features:
    """Features of every row: ``X`` holds, per row, the ``TERMS`` of the whole batch (waves
    included), then the ``PREFILL_TERMS`` of the first wave (the batch's TTFT), then the
    ``DECODE_TERMS`` of one step of the running sequences."""

    X: np.ndarray              # (n, len(TERMS) + len(TERMS)): total | prefill | decode step
    running: np.ndarray        # sequences running at once
    capacity: np.ndarray       # KV capacity in tokens
    feasible: np.ndarray       # at least one sequence fits
    # (N_FACTS, n): engine_advisor.model.formulas.memory.memory_fit's, per row
    facts: np.ndarray | None = None

    @property
    def total(self) -> np.ndarray:
        """(n, len(TERMS)) the whole batch."""
        return self.X[:, :N_TERMS]

    @property
    def prefill(self) -> np.ndarray:
        """(n, len(TERMS)): the first wave's prefill terms, zeros elsewhere."""
        out = np.zeros((len(self.X), N_TERMS))
        out[:, :N_PREFILL] = self.X[:, N_TERMS:N_TERMS + N_PREFILL]
        return out

    @property
    def tpot(self) -> np.ndarray:
        """(n, len(TERMS)): one decode step's terms, zeros elsewhere."""
        out = np.zeros((len(self.X), N_TERMS))
        out[:, N_PREFILL:] = self.X[:, N_TERMS + N_PREFILL:]
        return out


def engine_index(names) -> tuple[tuple[str, ...], np.ndarray]:
    """(the engines of a case's rows in order of appearance, each row's index into them)."""
    if not isinstance(names, np.ndarray):
        pos: dict[str, int] = {}
        idx = [pos.setdefault(e, len(pos)) for e in names]
        return tuple(pos), np.array(idx, dtype=np.intp)
    idx = np.full(len(names), -1, dtype=np.intp)
    engines: list[str] = []
    for e in engine_registry.names():     # the usual names: no sort of the rows' names
        rows = names == e
        if rows.any():
            idx[rows] = len(engines)
            engines.append(e)
    if (idx < 0).any():
        for e in np.unique(names[idx < 0]).tolist():
            idx[names == e] = len(engines)
            engines.append(e)
    return tuple(engines), idx


def static_rows(index: tuple[tuple[str, ...], np.ndarray], fraction, dcp, shape: ModelShape,
                tp: int, gpu_name: str, gpu_memory: float, knobs: MemoryKnobs = DEFAULT_KNOBS,
                advise: bool = False) -> np.ndarray:
    """The rows ``engine_advisor.model.formulas.rows.rows_into`` reads (ROW_FIELDS) with the
    configurations' fields filled: from each row's engine (``engine_index``) its reserve, whether it
    holds the activation peak, the largest prefill pass it replays as a CUDA graph for a model of
    this attention and how it lays out the model's state and KV on ``tp`` GPUs of ``gpu_name``
    (``engine_advisor.model.physics.memory.state_layout``); memory fraction, DCP size, the memory
    knobs as launched and whether to choose them for the workload (``advise``)."""
    engines, idx = index
    rows = np.empty((N_ROW_FIELDS, len(idx)))
    records = [engine_registry.get(e) for e in engines]
    layouts = [state_layout(e, shape, tp, gpu_name, gpu_memory) for e in engines]
    rows[0] = np.array([r.reserve() + x.graph_bytes for r, x in zip(records, layouts,
                                                                    strict=True)])[idx]
    rows[1] = fraction
    rows[5] = dcp
    rows[7] = 1.0
    rows[8] = np.array([float(r.counts_activations) for r in records])[idx]
    rows[9] = np.array([float(r.graphed_prefill_tokens(shape.attention))
                        for r in records])[idx]
    for field, values in ((R_MODE, [x.mode for x in layouts]),
                          (R_UNIT, [x.unit_bytes for x in layouts]),
                          (R_BLOCK, [x.block_tokens for x in layouts]),
                          (R_STATE_UNITS, [x.state_units for x in layouts]),
                          (R_ATTN_UNITS, [x.attn_units for x in layouts]),
                          (R_DEFAULT_RUNNING, [x.default_running for x in layouts]),
                          (R_RATIO, [knobs.state_ratio or x.ratio for x in layouts]),
                          (R_STATE, [x.state_bytes for x in layouts]),
                          (R_REPORT_UNITS, [x.report_units or x.state_units for x in layouts])):
        rows[field] = np.array(values, dtype=float)[idx]
    rows[R_MAX_RUNNING] = knobs.max_running
    rows[R_SLOTS] = knobs.state_slots
    rows[R_NO_PREFIX] = float(knobs.no_prefix_cache)
    # SGLang's state-slot knobs are a linear-attention pool's, not a sliding window's
    rows[R_ADVISE] = np.array([float(advise and not (x.windows and x.mode == SPLIT))
                               for x in layouts])[idx]
    return rows


def split_by_kernels(case: Case, index: tuple[tuple[str, ...], np.ndarray] | None = None
                     ) -> list[tuple[Case, np.ndarray | None]]:
    """A case's rows by the silicon their engines' kernels run on
    (``engine_advisor.model.hardware.silicon.Silicon.for_engine``): ``[(case, None)]`` when every
    engine runs on the case's silicon, else (the rows as a case on their engine's silicon, their
    indices in the case; None: all of them). ``index``: the case's ``engine_index`` when the
    caller has it."""
    engines, idx = index or engine_index(case.engine)
    sis = [case.silicon.for_engine(e) for e in engines]
    if all(si is case.silicon for si in sis):
        return [(case, None)]
    groups: dict[int, tuple[Silicon, list[int]]] = {}
    for k, si in enumerate(sis):
        groups.setdefault(id(si), (si, []))[1].append(k)
    if len(groups) == 1:
        return [(case.take(np.arange(len(idx)), sis[0]), None)]
    out = []
    for si, ks in groups.values():
        rows = np.flatnonzero(np.isin(idx, ks))
        out.append((case.take(rows, si), rows))
    return out


def kernel_inputs(case: Case, index: tuple[tuple[str, ...], np.ndarray] | None = None) -> tuple:
    """(K, collectives, read curve, rows, engine index) of a case: what
    ``engine_advisor.model.formulas.predict.predict_rows`` reads (the model's constants on its GPU
    and TP size, one column per row) and each row's ``engine_index``. A recommendation's query
    packs its own once (``engine_advisor.model.predict.query.Query``)."""
    ph = case.physics or physics_for(case.shape, case.silicon, case.tp)
    n = len(case.engine)
    index = index or engine_index(case.engine)
    gpu = case.silicon.gpu
    rows = static_rows(index, case.fraction, case.dcp, case.shape, case.tp, gpu.name,
                       gpu.memory_bytes, case.knobs, case.advise)
    max_dcp = float(rows[5].max()) if n else 1.0
    fill_sizes(rows, case.batch, case.context, case.output, case.share, case.diversity)
    return ph.K, ph.collectives(max_dcp), ph.curve, rows, index


def case_features(case: Case) -> Features:
    """Features of every row of a case, in one compiled pass per silicon its engines' kernels
    run on (``split_by_kernels``; ``engine_advisor.model.formulas.rows.rows_into``)."""
    index = engine_index(case.engine)
    parts = split_by_kernels(case, index)
    if len(parts) > 1:
        done = [(case_features(sub), rows) for sub, rows in parts]
        n = len(case)
        X = np.empty((n, 2 * N_TERMS))
        facts = np.empty((N_FACTS, n))
        for f, rows in done:
            X[rows], facts[:, rows] = f.X, f.facts
        return Features(X, facts[0], facts[1], facts[2] > 0.0, facts)
    case = parts[0][0]
    K, coll, curve, rows, _ = kernel_inputs(case, index)
    n = rows.shape[1]
    X = np.empty((n, 2 * N_TERMS))
    facts = np.empty((N_FACTS, n))
    rows_into(K, coll, curve, rows, X, facts)
    return Features(X, facts[0], facts[1], facts[2] > 0.0, facts)


def roofline_total_s(case: Case) -> np.ndarray:
    """Lower bound of each row's total time: the physics terms at spec-sheet peaks."""
    peak = Case(case.shape, roofline_silicon(case.silicon.gpu), case.tp, case.engine,
                case.batch, case.context, case.output, case.dcp, case.fraction, case.share,
                diversity=case.diversity, knobs=case.knobs, advise=case.advise)
    f = case_features(peak).total
    physics = [i for i, t in enumerate(TERMS) if t in PHYSICS_TERMS]
    return f[:, physics].sum(axis=1)
