"""The fitted cost model of all engines and the one function that turns a case into features.

Pipeline: architecture (``model.shape``) + GPU (``model.silicon``) -> physical terms
(``model.terms``) -> engine efficiencies (``model.estimator``, fitted) -> predictions.

A ``Case`` is a set of rows that share the served model, the GPU type and the TP size: one
workload on several configurations, or one configuration over a grid of contexts.
``case_features`` is the only place that builds features: prefill, decode steps, and the waves
an engine runs when the batch's KV does not fit at once.

``CostModel`` is data: one ``EngineCostModel`` per engine and GPU type, the calibrated ranges per
(engine, GPU, GPU count, DCP, served model), the memory fractions seen safe, fit metrics, the
data hash. Caches live in ``model.predictor.Predictor``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from model import engines as engine_registry
from model.dataset import Measurement, dataset_sha256
from model.estimator import EngineCostModel
from model.formulas import N_PREFILL, N_ROW_FIELDS, rows_into
from model.gpus import builtin_gpu
from model.shape import ModelShape
from model.silicon import Silicon, silicon_for
from model.terms import DECODE_TERMS, PHYSICS_TERMS, TERMS, physics_for

RANGE_DIMS = ("context_tokens", "batch_size", "output_tokens")
UNCALIBRATED_REL_SIGMA = 0.25   # added relative sd: no data for this engine on this hardware
TRANSFERRED_REL_SIGMA = 0.10    # added relative sd: data for this hardware, another model
EXTRAPOLATION_REL_SIGMA = 0.05  # added relative sd per doubling outside the calibrated range
MIN_CV_POINTS = 5
N_TERMS = len(TERMS)


def config_key(engine: str, gpu: str, num_gpus: int, dcp: int) -> str:
    return f"{engine}/{gpu.upper()}/{num_gpus}/{dcp}"


def efficiency_key(engine: str, gpu: str) -> str:
    """Efficiencies are fitted per engine and GPU type: an engine's kernels, schedulers and
    collectives perform differently on each GPU. A GPU without data gets the priors."""
    return f"{engine}/{gpu.upper()}"


# ------------------------------------------------------------------------------ features
class QueryFacts(NamedTuple):
    """Per configuration of a query: engine, DCP size, memory fraction and (calibration
    status, calibrated range or None) (``CostModel.calibrated_range``); and
    for a query of one row per configuration, the compiled code's input rows that do not
    depend on the workload's sizes (``kernel_inputs``) and each row's engine
    index (``engine_index``). Built and memoised by ``model.predictor.Predictor.facts``."""

    engines: list[str]
    dcps: list[float]
    fractions: list[float]
    ranges: list[tuple[str, dict | None]]
    rows: np.ndarray
    engine_index: tuple[tuple[str, ...], np.ndarray]


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
    facts: QueryFacts | None = None    # the query's per-configuration facts
    # routing diversity of a decode batch's tokens (model.formulas.batch_terms): 1 for a trained
    # router; below 1 for what an engine measured on random weights (CostModel.diversity)
    diversity: np.ndarray | list | float = 1.0

    def __len__(self) -> int:
        return len(self.engine)


@dataclass
class Features:
    """Features of every row: ``X`` holds, per row, the ``TERMS`` of the whole batch (waves
    included), then the ``PREFILL_TERMS`` of the first wave (the batch's TTFT), then the
    ``DECODE_TERMS`` of one step of the running sequences."""

    X: np.ndarray              # (n, len(TERMS) + len(TERMS)): total | prefill | decode step
    running: np.ndarray        # sequences running at once
    capacity: np.ndarray       # KV capacity in tokens
    feasible: np.ndarray       # at least one sequence fits

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


def static_rows(index: tuple[tuple[str, ...], np.ndarray], fraction, dcp) -> np.ndarray:
    """The rows ``model.formulas.rows_into`` reads (ROW_FIELDS) with the configurations'
    fields filled: engine reserve and whether it holds the activation peak (from each row's
    ``engine_index``), memory fraction and DCP size."""
    engines, idx = index
    rows = np.empty((N_ROW_FIELDS, len(idx)))
    records = [engine_registry.get(e) for e in engines]
    rows[0] = np.array([r.reserve() for r in records])[idx]
    rows[1] = fraction
    rows[5] = dcp
    rows[7] = 1.0
    rows[8] = np.array([float(r.counts_activations) for r in records])[idx]
    return rows


def kernel_inputs(case: Case) -> tuple:
    """(K, collectives, read curve, rows, engine index) of a case: what
    ``model.formulas.predict_rows`` reads (the model's constants on its GPU and TP size, one
    column per row) and each row's ``engine_index``."""
    ph = physics_for(case.shape, case.silicon, case.tp)
    n = len(case.engine)
    facts = case.facts
    if facts is not None and len(facts.engines) == n:    # one row per configuration
        rows = facts.rows.copy()
        max_dcp = max(facts.dcps)
        index = facts.engine_index
    else:
        index = engine_index(case.engine)
        rows = static_rows(index, case.fraction, case.dcp)
        max_dcp = float(rows[5].max()) if n else 1.0
    rows[2] = case.batch
    rows[3] = case.context
    rows[4] = case.output
    rows[6] = case.share
    rows[7] = case.diversity
    return ph.K, ph.collectives(max_dcp), ph.curve, rows, index


def case_features(case: Case) -> Features:
    """Features of every row of a case, in one compiled pass (``model.formulas.rows_into``)."""
    K, coll, curve, rows, _ = kernel_inputs(case)
    n = rows.shape[1]
    X = np.empty((n, 2 * N_TERMS))
    facts = np.empty((3, n))
    rows_into(K, coll, curve, rows, X, facts)
    return Features(X, facts[0], facts[1], facts[2] > 0.0)


def roofline_total_s(case: Case) -> np.ndarray:
    """Lower bound of each row's total time: the physics terms at spec-sheet peaks."""
    from model.silicon import roofline_silicon

    peak = Case(case.shape, roofline_silicon(case.silicon.gpu), case.tp, case.engine,
                case.batch, case.context, case.output, case.dcp, case.fraction, case.share,
                diversity=case.diversity)
    f = case_features(peak).total
    physics = [i for i, t in enumerate(TERMS) if t in PHYSICS_TERMS]
    return f[:, physics].sum(axis=1)


# ------------------------------------------------------------------------------ the fit
@dataclass
class Prediction:
    total: np.ndarray
    total_lo: np.ndarray
    total_hi: np.ndarray
    prefill: np.ndarray        # the batch's TTFT: prefill of the first wave
    prefill_all: np.ndarray    # seconds spent prefilling, all waves
    tpot: np.ndarray
    step_parts: np.ndarray     # (n, len(DECODE_TERMS)) seconds of each term of a decode step
    running: np.ndarray
    capacity: np.ndarray
    feasible: np.ndarray


@dataclass(eq=False)
class CostModel:
    engines: dict[str, EngineCostModel] = field(default_factory=dict)
    ranges: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)
    points: dict[str, int] = field(default_factory=dict)
    memory: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    metrics: dict[str, dict[str, float | int | None]] = field(default_factory=dict)
    data_sha256: str = ""
    sources: list[str] = field(default_factory=list)
    hardware: dict[str, dict[str, str]] = field(default_factory=dict)
    roofline_warnings: list[str] = field(default_factory=list)
    version: str = ""

    # routing diversity of each engine's random-weight rows (model.fitting): 1 elsewhere
    diversity: dict[str, float] = field(default_factory=dict)
    # every fitted point's held-out prediction next to its prior's (model.fitting.fit_engine)
    held_out: list[dict] = field(default_factory=list)

    @classmethod
    def fit(cls, rows: Sequence[Measurement], *, sources: Sequence[str] = ()) -> CostModel:
        """Fit every engine's efficiencies (``model.fitting``: pooled per GPU family, then
        per GPU; terms freed only where the held-out error falls; every point's held-out
        prediction kept in ``held_out``)."""
        from model.fitting import fit_engine

        if not rows:
            raise ValueError("no calibration rows to fit")
        self = cls(data_sha256=dataset_sha256(rows), sources=list(sources))
        by_engine: dict[str, list[Measurement]] = defaultdict(list)
        for r in rows:
            mem = self.memory.setdefault(f"{r.engine}/{r.gpu}", {"safe": [], "unsafe": []})
            bucket = "unsafe" if r.unsafe else "safe"
            if r.mem_fraction not in mem[bucket]:
                mem[bucket].append(r.mem_fraction)
            if not trainable(r):
                continue
            by_engine[r.engine].append(r)
            key = config_key(r.engine, r.gpu, r.num_gpus, r.dcp_size)
            per_model = self.ranges.setdefault(key, {})
            rng = per_model.setdefault(row_shape(r).key,
                                       {d: [math.inf, -math.inf] for d in RANGE_DIMS})
            for d in RANGE_DIMS:
                v = float(getattr(r, d))
                rng[d] = [min(rng[d][0], v), max(rng[d][1], v)]
            self.points[key] = self.points.get(key, 0) + 1
        for mem in self.memory.values():
            mem["safe"].sort()
            mem["unsafe"].sort()
        if not by_engine:
            raise ValueError("no row has a measured time (total_s, ttft_s, decode_step_s or "
                             "tpot_s)")
        for engine, erows in sorted(by_engine.items()):
            ef = fit_engine(engine, erows)
            self.engines.update(ef.estimators)
            self.metrics.update(ef.metrics)
            self.held_out.extend(ef.records)
            if ef.diversity != 1.0:
                self.diversity[engine] = ef.diversity
        self.roofline_warnings = roofline_check(rows)
        self.version = f"fit-{self.data_sha256[:12]}"
        for r in rows:
            gpu = _gpu_or_none(r.gpu)
            if gpu is not None:
                self.hardware[r.gpu] = dict(silicon_for(gpu).sources)
        return self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_predictor", None)    # caches (model.predictor) are not part of the model
        return state

    @property
    def engine_names(self) -> list[str]:
        """Engines with calibration data (on any GPU)."""
        return sorted({k.split("/")[0] for k in self.engines})

    def coverage(self, engine: str, gpu: str, num_gpus: int, dcp: int, model_key: str,
                 values: dict[str, float]) -> tuple[str, float]:
        """("calibrated" | "transferred" | "uncalibrated", doublings outside the range).

        calibrated: data for this engine, GPU, GPU count, DCP and served model (the same
        architecture hash, whatever its name); transferred: data for the hardware configuration
        but only for other models."""
        status, rng = self.calibrated_range(engine, gpu, num_gpus, dcp, model_key)
        if status == "uncalibrated":
            return status, math.inf
        return status, doublings_outside(rng, values)

    def calibrated_range(self, engine: str, gpu: str, num_gpus: int, dcp: int,
                         model_key: str) -> tuple[str, dict[str, list[float]] | None]:
        """(status, the calibrated range of ``RANGE_DIMS`` or None), as ``coverage``."""
        per_model = self.ranges.get(config_key(engine, gpu, num_gpus, dcp))
        if not per_model:
            return "uncalibrated", None
        rng = per_model.get(model_key)
        if rng is None:   # the same architecture under another name (a config.json of a preset)
            arch = model_key.rpartition("@")[2]
            rng = next((v for k, v in per_model.items() if k.rpartition("@")[2] == arch), None)
        return ("transferred", None) if rng is None else ("calibrated", rng)

    def safe_fractions(self, engine: str, gpu: str) -> dict[str, list[float]]:
        return self.memory.get(f"{engine}/{gpu.upper()}", {"safe": [], "unsafe": []})


def doublings_outside(rng: dict[str, list[float]] | None, values: dict[str, float]) -> float:
    """How many doublings ``values`` lie outside a calibrated range (0 inside, and 0 without a
    range: a transferred configuration is widened by its own term)."""
    if rng is None:
        return 0.0
    out = 0.0
    for d, v in values.items():
        lo, hi = rng[d]
        if v > hi:
            out += math.log2(v / hi)
        elif v < lo:
            out += math.log2(lo / v)
    return out


# ------------------------------------------------------------------------------ rows
def _gpu_or_none(name: str):
    try:
        return builtin_gpu(name)
    except KeyError:
        return None


def row_shape(r: Measurement) -> ModelShape:
    """The served model of a dataset row: its preset when the row names one, else the KV
    bytes alone (a bare shape)."""
    from model.workload import shape_of

    return shape_of(r.model, r.kv_cache_dtype, r.kv_bytes_per_token, r.kv_shards)


def row_case(r: Measurement, diversity: float = 1.0) -> Case:
    """A dataset row as a one-row case (``diversity``: its decode batch's routing diversity)."""
    gpu = _gpu_or_none(r.gpu)
    if gpu is None:
        raise ValueError(f"row for GPU {r.gpu!r}: unknown GPU type (no physics known)")
    one = lambda v: np.array([float(v)])  # noqa: E731
    return Case(row_shape(r), silicon_for(gpu), r.num_gpus, np.array([r.engine]),
                one(r.batch_size), one(r.context_tokens), one(r.output_tokens), one(r.dcp_size),
                one(r.mem_fraction), float(r.prefix_share), diversity=float(diversity))


def training_matrix(rows: Sequence[Measurement]) -> tuple[np.ndarray, np.ndarray]:
    """Estimator rows: one per fitted quantity of each dataset row (``model.fitting``)."""
    from model.fitting import observations

    obs = observations(rows)
    return obs.X, obs.y


def roofline_check(rows: Sequence[Measurement]) -> list[str]:
    """A warning for every measured total faster than its roofline (spec-sheet peaks)."""
    out = []
    for r in rows:
        if not trainable(r) or r.total_s is None or _gpu_or_none(r.gpu) is None:
            continue
        floor = float(roofline_total_s(row_case(r))[0])
        if r.total_s < floor:
            out.append(f"{r.engine} dcp {r.dcp_size} on {r.num_gpus} x {r.gpu}, "
                       f"{r.batch_size} x {r.context_tokens:,} + {r.output_tokens:,} tokens: "
                       f"measured {r.total_s:.3g} s is faster than its roofline {floor:.3g} s "
                       "(spec-sheet peaks): check the row's model, batch and units")
    return out


def trainable(r: Measurement) -> bool:
    """Rows the estimators train on: timed, and not an OOM or crash."""
    return not r.unsafe and r.timed


__all__ = ["Case", "CostModel", "DECODE_TERMS", "Features", "Prediction", "case_features",
           "config_key", "roofline_check", "row_case", "row_shape", "training_matrix",
           "trainable"]
