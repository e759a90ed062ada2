"""The fitted cost model of all engines: data, not code.

Pipeline: architecture (``engine_advisor.model.physics.shape``) + GPU
(``engine_advisor.model.hardware.silicon``) -> physical terms
(``engine_advisor.model.physics.terms``, per query ``engine_advisor.model.physics.features``) ->
engine efficiencies (``engine_advisor.model.fit.estimator``, fitted by
``engine_advisor.model.fit.fitting``) -> predictions (``engine_advisor.model.predict.predictor``).

``CostModel`` is data: one ``EngineCostModel`` per engine and GPU type, the calibrated ranges per
(engine, GPU, GPU count, DCP, served model), the memory fractions seen safe, fit metrics, the
data hash. Caches live in ``engine_advisor.model.predict.predictor.Predictor``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engine_advisor.model.fit.dataset import Measurement, dataset_sha256
from engine_advisor.model.fit.estimator import EngineCostModel
from engine_advisor.model.fit.fitting import family_key, fit_engine
from engine_advisor.model.fit.rows import gpu_or_none, roofline_check, row_shape, trainable
from engine_advisor.model.hardware.silicon import silicon_for

RANGE_DIMS = ("context_tokens", "batch_size", "output_tokens")
UNCALIBRATED_REL_SIGMA = 0.25   # added relative sd: no data for this engine on this hardware
TRANSFERRED_REL_SIGMA = 0.10    # added relative sd: data for this hardware, another model
EXTRAPOLATION_REL_SIGMA = 0.05  # added relative sd per doubling outside the calibrated range
MIN_CV_POINTS = 5


def _arch(model_key: str) -> str:
    """The architecture hash of a served model's key (``name@hash``): a config.json of a preset
    is that preset."""
    return model_key.rpartition("@")[2]


def config_key(engine: str, gpu: str, num_gpus: int, dcp: int) -> str:
    return f"{engine}/{gpu.upper()}/{num_gpus}/{dcp}"


def efficiency_key(engine: str, gpu: str) -> str:
    """Efficiencies are fitted per engine and GPU type: an engine's kernels, schedulers and
    collectives perform differently on each GPU. A GPU without data gets the priors."""
    return f"{engine}/{gpu.upper()}"


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

    # routing diversity of each engine's random-weight rows per served model
    # (engine_advisor.model.fit.fitting.choose_diversity): 1 where a model is not named
    diversity: dict[str, dict[str, float]] = field(default_factory=dict)
    # every fitted point's held-out prediction next to its prior's
    # (engine_advisor.model.fit.fitting.fit_engine)
    held_out: list[dict] = field(default_factory=list)

    @classmethod
    def fit(cls, rows: Sequence[Measurement], *, sources: Sequence[str] = ()) -> CostModel:
        """Fit every engine's efficiencies (``engine_advisor.model.fit.fitting``: pooled per GPU
        family, then per GPU; terms freed only where the held-out error falls; every point's
        held-out prediction kept in ``held_out``)."""
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
            if ef.diversity:
                self.diversity[engine] = ef.diversity
        self.roofline_warnings = roofline_check(rows)
        self.version = f"fit-{self.data_sha256[:12]}"
        for r in rows:
            gpu = gpu_or_none(r.gpu)
            if gpu is not None:
                self.hardware[r.gpu] = dict(silicon_for(gpu).sources)
        return self

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        # caches (engine_advisor.model.predict.predictor) are not part of the model
        state.pop("_predictor", None)
        state.pop("_queries", None)         # (engine_advisor.model.queries)
        return state

    @property
    def engine_names(self) -> list[str]:
        """Engines with calibration data (on any GPU)."""
        return sorted({k.split("/")[0] for k in self.engines})

    def calibrated_range(self, engine: str, gpu: str, num_gpus: int, dcp: int,
                         model_key: str) -> tuple[str, dict[str, list[float]] | None]:
        """("calibrated" | "transferred" | "uncalibrated", the calibrated range of
        ``RANGE_DIMS`` or None).

        calibrated: data for this engine, GPU, GPU count, DCP and served model (the same
        architecture hash, whatever its name); transferred: data for the hardware configuration
        but only for other models."""
        per_model = self.ranges.get(config_key(engine, gpu, num_gpus, dcp))
        if not per_model:
            return "uncalibrated", None
        rng = per_model.get(model_key)
        if rng is None:   # the same architecture under another name (a config.json of a preset)
            arch = _arch(model_key)
            rng = next((v for k, v in per_model.items() if _arch(k) == arch), None)
        if rng is not None:
            return "calibrated", rng
        level = self.level_for(engine, gpu, model_key)
        return ("transferred", None) if level is not None else ("uncalibrated", None)

    def level_for(self, engine: str, gpu: str, model_key: str) -> str | None:
        """The key of the fitted level whose efficiencies predict ``model_key`` on ``gpu``:
        the GPU type's own (``efficiency_key``), else its family's (``family_key``), else None
        (the physics priors). A level fitted on too few points to hold any out
        (``EngineCostModel.transfers_`` false: the B300 seed's two points per engine) applies
        only to the served models it was fitted on (``models_``): it reproduces those points,
        and nothing tells the terms it moved from those points' own circumstances, so another
        model does not inherit them."""
        arch = _arch(model_key)
        for key in (efficiency_key(engine, gpu), family_key(engine, gpu)):
            est = self.engines.get(key)
            if est is None:
                continue
            if getattr(est, "transfers_", True) or arch in {_arch(m) for m in
                                                             getattr(est, "models_", ())}:
                return key
        return None

    def safe_fractions(self, engine: str, gpu: str) -> dict[str, list[float]]:
        return self.memory.get(f"{engine}/{gpu.upper()}", {"safe": [], "unsafe": []})
