"""The fitted cost model of all engines: per-engine estimators plus what the data covered.

``CostModel.fit(rows)`` turns dataset rows into estimator rows (one per measured quantity),
fits one ``EngineCostModel`` per engine, and records the calibrated ranges per
(engine, gpu, num_gpus, dcp) and which memory fractions were safe.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from model.dataset import Measurement, dataset_sha256
from model.estimator import (
    N_PREFILL,
    QTY_PREFILL,
    QTY_TOTAL,
    QTY_TPOT,
    EngineCostModel,
    feature_blocks,
)
from model.hardware import GpuSpec, KvReadModel, builtin_gpu, dcp_comm_model, kv_read_model

RANGE_DIMS = ("context_tokens", "batch_size", "kv_bytes_per_token", "output_tokens")
UNCALIBRATED_REL_SIGMA = 0.25   # added relative sd for a configuration with no data at all
EXTRAPOLATION_REL_SIGMA = 0.05  # added relative sd per doubling outside the calibrated range
MIN_CV_POINTS = 5
QTY_NAMES = {QTY_TOTAL: "total", QTY_PREFILL: "ttft", QTY_TPOT: "tpot"}


def config_key(engine: str, gpu: str, num_gpus: int, dcp: int) -> str:
    return f"{engine}/{gpu.upper()}/{num_gpus}/{dcp}"


@dataclass
class Query:
    """Arrays of equal length describing (workload, config) pairs, possibly of several engines
    and GPUs. ``kv_read_s`` is the seconds one decode step at the mean context spends reading KV,
    from the GPU's KV-read model (``kv_read_seconds``)."""

    engine: np.ndarray         # index into CostModel.engine_names
    context: np.ndarray
    output: np.ndarray
    batch: np.ndarray
    kv_per_gpu: np.ndarray     # kv bytes per token held per GPU before DCP (kv / kv_shards)
    dcp: np.ndarray
    kv_read_s: np.ndarray
    # combine work in sequence-equivalents from the GPU's measured DCP profile
    # (``dcp_combine_features``); None or NaN: the spec shape batch * (dcp - 1) / dcp
    dcp_combine: np.ndarray | None = None
    # multiplier of the predicted prefill (prefix reuse, model/capabilities.py); None = 1.
    # Applied by CostModel.predict / predict_total only: estimator rows never carry it.
    prefill_scale: np.ndarray | None = None

    def rows(self, quantity: int) -> np.ndarray:
        """Estimator rows (estimator.COLUMNS, plus the measured combine column when set) for
        one quantity."""
        X = np.empty((len(self.context), 7 if self.dcp_combine is None else 8))
        X[:, 0] = self.context
        X[:, 1] = self.output
        X[:, 2] = self.batch
        X[:, 3] = self.kv_per_gpu
        X[:, 4] = self.dcp
        X[:, 5] = self.kv_read_s
        X[:, 6] = quantity
        if self.dcp_combine is not None:
            d = np.maximum(self.dcp, 1.0)
            X[:, 7] = np.where(np.isfinite(self.dcp_combine), self.dcp_combine,
                               self.batch * (d - 1.0) / d)
        return X


def kv_read_seconds(read: KvReadModel, context, output, batch, kv_per_gpu, dcp) -> np.ndarray:
    """KV-read seconds of one decode step at the mean decode context (ctx + output / 2)."""
    return read.seconds(batch * (context + output / 2.0) * kv_per_gpu / dcp)


def dcp_combine_features(gpu: GpuSpec, batch, dcp) -> np.ndarray | None:
    """The combine feature from the GPU's measured DCP profile, or None (spec shape)."""
    comm = dcp_comm_model(gpu)
    if comm is None:
        return None
    return comm.sequence_equivalents(np.asarray(batch, dtype=float), np.asarray(dcp, dtype=float))


@dataclass
class Prediction:
    total: np.ndarray
    total_lo: np.ndarray
    total_hi: np.ndarray
    prefill: np.ndarray
    tpot: np.ndarray
    step_parts: np.ndarray     # (interval rows, 3): fixed, kv_read, dcp seconds of a decode step


@dataclass
class CostModel:
    engines: dict[str, EngineCostModel] = field(default_factory=dict)
    ranges: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    points: dict[str, int] = field(default_factory=dict)
    memory: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    metrics: dict[str, dict[str, float | int | None]] = field(default_factory=dict)
    data_sha256: str = ""
    sources: list[str] = field(default_factory=list)
    hardware: dict[str, str] = field(default_factory=dict)
    version: str = ""

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit(cls, rows: Sequence[Measurement], *, sources: Sequence[str] = (),
            estimator_params: dict | None = None) -> CostModel:
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
            rng = self.ranges.setdefault(key, {d: [math.inf, -math.inf] for d in RANGE_DIMS})
            for d in RANGE_DIMS:
                v = float(getattr(r, d))
                rng[d] = [min(rng[d][0], v), max(rng[d][1], v)]
            self.points[key] = self.points.get(key, 0) + 1
        for mem in self.memory.values():
            mem["safe"].sort()
            mem["unsafe"].sort()
        if not by_engine:
            raise ValueError("no row has a measured time (ttft_s, tpot_s or total_s)")
        # Engines with DCP data first: an engine without any lends their DCP coefficients as its
        # prior, so its uncalibrated DCP sizes are not predicted as free.
        order = sorted(by_engine, key=lambda e: (not any(r.dcp_size > 1 for r in by_engine[e]), e))
        for engine in order:
            erows = by_engine[engine]
            params = dict(estimator_params or {})
            if not any(r.dcp_size > 1 for r in erows):
                params["prior"] = {**(params.get("prior") or {}), **self._dcp_prior()}
            X, y = training_matrix(erows)
            est = EngineCostModel(**params).fit(X, y)
            self.engines[engine] = est
            self.metrics[engine] = {"n_points": len(erows), "n_observations": len(y),
                                    "residual_rel_std": est.residual_rel_std_,
                                    "cv_mape": cv_mape(erows, estimator_params)}
        self.version = f"fit-{self.data_sha256[:12]}"
        self.hardware = {r.gpu: kv_read_model(gpu).source
                         for r in rows if (gpu := _gpu_or_none(r.gpu)) is not None}
        return self

    def _dcp_prior(self) -> dict[str, float]:
        fitted = [est.coefficients_ for est in self.engines.values()]
        if not fitted:
            return {}
        means = {n: float(np.mean([c[n] for c in fitted]))
                 for n in ("dcp_sync_s_per_log2", "dcp_combine_s_per_seq")}
        return {n: v for n, v in means.items() if v > 0}

    # ---------------------------------------------------------------- predicting
    @property
    def engine_names(self) -> list[str]:
        return sorted(self.engines)

    def _stacked(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Coefficients (E, k), covariances (E, k, k), relative noise (E,) in engine_names order."""
        cache = self.__dict__.get("_stack")
        if cache is None:
            ests = [self.engines[e] for e in self.engine_names]
            cache = (np.array([e.coef_ for e in ests]), np.array([e.coef_cov_ for e in ests]),
                     np.array([max(e.residual_rel_std_, e.noise_floor) for e in ests]))
            self.__dict__["_stack"] = cache
        return cache

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_stack", None)
        state.pop("_memory_choices", None)
        state.pop("_config_arrays", None)
        state.pop("_range_index", None)
        return state

    def predict(self, q: Query, rel_extra: np.ndarray | None = None, z: float = 1.645,
                interval_rows: int | None = None) -> Prediction:
        """All quantities with a 90 % interval on the total, vectorised over rows and engines.

        Same arithmetic as ``EngineCostModel.predict_interval`` (checked by the tests), batched
        across engines for the recommender's hot path.
        """
        coef, cov, rel = self._stacked()
        C = coef[q.engine]
        pre, step = self._features(q)
        prefill = np.einsum("ij,ij->i", pre, C[:, :N_PREFILL])
        parts = step * C[:, N_PREFILL:]
        tpot = parts.sum(axis=1)
        steps = np.maximum(q.output - 1.0, 0.0)
        total = prefill + steps * tpot
        # Interval on the first ``interval_rows`` rows only (the rest get a zero-width one).
        k = len(total) if interval_rows is None else interval_rows
        D = np.hstack([pre[:k], step[:k] * steps[:k, None]])
        eng = q.engine[:k]
        if k <= 64:  # few rows (one recommendation): one gathered einsum
            param_var = np.einsum("ij,ijk,ik->i", D, cov[eng], D)
        else:  # many rows (batches): one matmul per engine, no (n, k, k) gather
            param_var = np.empty(k)
            for e in np.unique(eng):
                rows = eng == e
                De = D[rows]
                param_var[rows] = np.einsum("ij,ij->i", De @ cov[e], De)
        r = rel[eng] if rel_extra is None else rel[eng] + rel_extra[:k]
        sd = np.zeros(len(total))
        sd[:k] = np.sqrt(np.maximum(param_var, 0.0) + (r * total[:k]) ** 2)
        pk = parts[:k]
        step_parts = np.column_stack([pk[:, 0] + pk[:, 1], pk[:, 2], pk[:, 3] + pk[:, 4]])
        return Prediction(total, np.maximum(total - z * sd, 0.0), total + z * sd, prefill, tpot,
                          step_parts)

    def predict_total(self, q: Query) -> np.ndarray:
        coef, _, _ = self._stacked()
        C = coef[q.engine]
        pre, step = self._features(q)
        steps = np.maximum(q.output - 1.0, 0.0)
        return (np.einsum("ij,ij->i", pre, C[:, :N_PREFILL])
                + steps * np.einsum("ij,ij->i", step, C[:, N_PREFILL:]))

    @staticmethod
    def _features(q: Query) -> tuple[np.ndarray, np.ndarray]:
        pre, step = feature_blocks(q.context, q.output, q.batch, q.kv_per_gpu, q.dcp, q.kv_read_s,
                                   q.dcp_combine)
        if q.prefill_scale is not None:
            pre = pre * q.prefill_scale[:, None]
        return pre, step

    def coverage(self, engine: str, gpu: str, num_gpus: int, dcp: int,
                 values: dict[str, float]) -> tuple[bool, float]:
        """(calibrated, doublings outside the calibrated range) of one query."""
        index = self.__dict__.get("_range_index")
        if index is None:  # tuple keys: no string formatting per query (hot path)
            index = self.__dict__["_range_index"] = {
                tuple(k.split("/")[:2]) + tuple(int(x) for x in k.split("/")[2:]): v
                for k, v in self.ranges.items()}
        rng = index.get((engine, gpu.upper(), num_gpus, dcp))
        if rng is None:
            return False, math.inf
        out = 0.0
        for d, v in values.items():
            lo, hi = rng[d]
            if v > hi:
                out += math.log2(v / hi)
            elif v < lo:
                out += math.log2(lo / v)
        return True, out

    def safe_fractions(self, engine: str, gpu: str) -> dict[str, list[float]]:
        return self.memory.get(f"{engine}/{gpu.upper()}", {"safe": [], "unsafe": []})


def _gpu_or_none(name: str) -> GpuSpec | None:
    try:
        return builtin_gpu(name)
    except KeyError:
        return None


def training_matrix(rows: Sequence[Measurement]) -> tuple[np.ndarray, np.ndarray]:
    """Estimator rows: one per measured quantity (total, TTFT, TPOT) of each dataset row."""
    gpus = []
    for r in rows:
        gpu = _gpu_or_none(r.gpu)
        if gpu is None:
            raise ValueError(f"row for GPU {r.gpu!r}: unknown GPU type (no bandwidth known)")
        gpus.append(gpu)
    # some GPUs have a DCP profile: NaN gives the others the spec shape (Query.rows)
    profiled = any(dcp_comm_model(g) is not None for g in set(gpus))
    Xs, ys = [], []
    for r, gpu in zip(rows, gpus, strict=True):
        cols = [np.array([float(v)]) for v in (r.context_tokens, r.output_tokens, r.batch_size,
                                                r.kv_bytes_per_token / r.kv_shards, r.dcp_size)]
        combine = dcp_combine_features(gpu, cols[2], cols[4])
        if combine is None and profiled:
            combine = np.full(1, np.nan)
        q = Query(np.zeros(1, dtype=int), *cols, kv_read_seconds(kv_read_model(gpu), *cols),
                  combine)
        for qty, val in ((QTY_TOTAL, r.total_s), (QTY_PREFILL, r.ttft_s), (QTY_TPOT, r.tpot_s)):
            if val is not None:
                Xs.append(q.rows(qty))
                ys.append(val)
    return np.vstack(Xs), np.array(ys)


def trainable(r: Measurement) -> bool:
    """Rows the estimators train on: timed, and not an OOM or crash."""
    return not r.unsafe and not (r.total_s is None and r.tpot_s is None and r.ttft_s is None)


def point_key(r: Measurement) -> tuple:
    """One grid point: its repeats and memory fractions share it (and stay together in CV)."""
    return (r.engine, r.gpu, r.num_gpus, r.dcp_size, r.context_tokens, r.batch_size,
            r.output_tokens, r.kv_bytes_per_token, r.kv_shards)


def cross_validate(rows: Sequence[Measurement], estimator_params: dict | None = None,
                   n_bootstrap: int = 0) -> list[dict]:
    """Leave one grid point out at a time (all its repeats together, so a repeat cannot vouch
    for its twin), refit that engine's estimator on the rest, predict the held-out times.

    One record per held-out measured quantity: engine, dcp_size, context_tokens, batch_size,
    output_tokens, quantity ("total", "ttft", "tpot"), measured, predicted, and with
    ``n_bootstrap`` > 0 a 90 % interval (lo, hi). Engines with fewer than two points are
    skipped."""
    by_engine: dict[str, list[Measurement]] = defaultdict(list)
    for r in rows:
        if trainable(r):
            by_engine[r.engine].append(r)
    params = {**(estimator_params or {}), "n_bootstrap": n_bootstrap}
    out: list[dict] = []
    for engine, erows in sorted(by_engine.items()):
        points = sorted({point_key(r) for r in erows})
        if len(points) < 2:
            continue
        for p in points:
            X, y = training_matrix([r for r in erows if point_key(r) != p])
            est = EngineCostModel(**params).fit(X, y)
            Xh, yh = training_matrix([r for r in erows if point_key(r) == p])
            if n_bootstrap:
                pred, lo, hi = est.predict_interval(Xh)
            else:
                pred, lo, hi = est.predict_rows(Xh), None, None
            for i in range(len(yh)):
                rec = {"engine": engine, "dcp_size": p[3], "context_tokens": p[4],
                       "batch_size": p[5], "output_tokens": p[6],
                       "quantity": QTY_NAMES[int(Xh[i, 6])], "measured": float(yh[i]),
                       "predicted": float(pred[i])}
                if lo is not None:
                    rec["lo"], rec["hi"] = float(lo[i]), float(hi[i])
                out.append(rec)
    return out


def cv_mape(rows: Sequence[Measurement], estimator_params: dict | None) -> float | None:
    """Mean absolute percentage error of ``cross_validate`` over all held-out times (None
    below MIN_CV_POINTS grid points)."""
    if len({point_key(r) for r in rows if trainable(r)}) < MIN_CV_POINTS:
        return None
    recs = cross_validate(rows, estimator_params)
    return float(np.mean([abs(r["predicted"] - r["measured"]) / r["measured"] for r in recs]))