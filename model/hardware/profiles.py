"""Measured hardware profiles: the JSON files ``engine-advisor calibrate gpu|dcp`` writes.

The curve fits used both to build a profile (in calibration/) and to evaluate one
(model/hardware/silicon.py; the evaluation itself is
``engine_advisor.model.formulas.hardware.read_s``), and the loader that finds a GPU's profile by
path. The profiles directory is ``$ENGINE_ADVISOR_PROFILES_DIR`` or, by default,
``calibration/profiles`` beside this package; a missing directory means "no profiles" (the spec
sheet is used). Each directory is read once per
process (``clear_profile_cache`` forgets it).

Read curve: seconds of one call that reads ``b`` bytes, ``t(b)``, stored as knots (bytes,
seconds) fitted from measurements: medians in half-octave bins of bytes, made non-decreasing by
isotonic regression (scikit-learn's) and then strictly increasing. Between knots
``log t`` is linear in ``log b``; below the first knot ``t`` rises linearly from the fixed
per-call overhead; above the last it grows at the asymptotic bandwidth of the largest reads.
"""

from __future__ import annotations

import json
import math
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
from sklearn.isotonic import isotonic_regression

from engine_advisor.model.formulas.hardware import read_many, read_s

PROFILES_ENV = "ENGINE_ADVISOR_PROFILES_DIR"
DEFAULT_PROFILES_DIR = Path(__file__).resolve().parents[2] / "calibration" / "profiles"
KIND_GPU = "gpu-profile"
KIND_DCP = "dcp-profile"
BINS_PER_OCTAVE = 2


def profiles_dir() -> Path:
    env = os.environ.get(PROFILES_ENV)
    return Path(env) if env else DEFAULT_PROFILES_DIR


# ------------------------------------------------------------------------------ read curves
def fit_read_curve(nbytes, seconds, overhead_s: float | None = None) -> dict:
    """Fit a monotone read curve to measured (bytes per call, seconds per call) points."""
    b = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    ok = (b > 0) & (t > 0) & np.isfinite(b) & np.isfinite(t)
    b, t = b[ok], t[ok]
    if len(b) < 2:
        raise ValueError("a read curve needs at least two positive measurements")
    bins = np.floor(np.log2(b) * BINS_PER_OCTAVE).astype(int)
    kb, kt, kw = [], [], []
    for key in np.unique(bins):
        sel = bins == key
        kb.append(float(np.exp(np.mean(np.log(b[sel])))))
        kt.append(float(np.median(t[sel])))
        kw.append(float(sel.sum()))
    kb_arr = np.array(kb)
    kt_arr = isotonic_regression(np.array(kt), sample_weight=np.array(kw), increasing=True)
    for i in range(1, len(kt_arr)):  # strictly increasing
        kt_arr[i] = max(kt_arr[i], kt_arr[i - 1] * (1 + 1e-6))
    floor = float(kt_arr[0]) if overhead_s is None else min(float(overhead_s), float(kt_arr[0]))
    # asymptotic bandwidth: slope over the knots within 16x of the largest read
    top = kb_arr >= kb_arr[-1] / 16
    if top.sum() >= 2 and kt_arr[top][-1] > kt_arr[top][0]:
        tail = (kb_arr[top][-1] - kb_arr[top][0]) / (kt_arr[top][-1] - kt_arr[top][0])
    else:
        tail = kb_arr[-1] / kt_arr[-1]
    tail = max(tail, kb_arr[-1] / kt_arr[-1])  # never slower than the largest read's average
    return {"bytes": kb_arr.tolist(), "seconds": kt_arr.tolist(), "overhead_s": floor,
            "asymptotic_Bps": float(tail), "n_points": int(len(b))}


class ReadCurve:
    """A read curve as ``engine_advisor.model.formulas.hardware.read_s`` takes it: ``table``
    (4, m) of knot bytes, seconds and their logs, the per-call overhead ``t0``, the asymptotic
    bandwidth ``asym``; with no knots (``spec``) a plain bandwidth ``bps``. Callable on a float or
    an array of byte counts."""

    __slots__ = ("table", "t0", "asym", "bps")

    def __init__(self, curve: dict | None, bps: float = 0.0):
        if curve is None:
            self.table, self.t0, self.asym, self.bps = np.zeros((4, 0)), 0.0, 1.0, float(bps)
            return
        kb = np.asarray(curve["bytes"], dtype=float)
        kt = np.asarray(curve["seconds"], dtype=float)
        self.table = np.ascontiguousarray(np.stack([kb, kt, np.log(kb), np.log(kt)]))
        self.t0 = float(curve["overhead_s"])
        self.asym = float(curve["asymptotic_Bps"])
        self.bps = 0.0

    @classmethod
    def spec(cls, bps: float) -> ReadCurve:
        return cls(None, bps)

    def __call__(self, nbytes):
        if isinstance(nbytes, np.ndarray):
            x = np.ascontiguousarray(nbytes, dtype=float)
            return read_many(x.ravel(), self.table, self.t0, self.asym,
                              self.bps).reshape(x.shape)
        return read_s(float(nbytes), self.table, self.t0, self.asym, self.bps)


def eval_read_curve(curve: dict, nbytes) -> np.ndarray:
    """Seconds of one call reading ``nbytes`` (array-like) on a fitted read curve."""
    x = np.asarray(nbytes, dtype=float)
    return ReadCurve(curve)(np.atleast_1d(x)).reshape(x.shape)


# ------------------------------------------------------------------------- DCP comm model
def fit_linear_pos(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares y = a + s * x with a, s >= 0, weighted by 1 / y (relative error)."""
    from scipy.optimize import nnls

    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    w = 1.0 / y
    A = np.column_stack([np.ones_like(x), x]) * w[:, None]
    coef, _ = nnls(A, y * w)
    return float(coef[0]), float(coef[1])


def dcp_recv_bytes(backend: str, dcp, batch, heads: int, v_dim: int, out_bytes: int = 2):
    """Bytes one rank receives per layer when combining DCP partials of ``heads`` query heads:
    outputs (``v_dim`` values at ``out_bytes``) plus one fp32 LSE per head.

    ag (all-gather + local merge): every rank receives every other rank's partials of all heads;
    a2a (all-to-all): every rank receives the other ranks' partials of its 1/dcp of the heads.
    """
    d = np.asarray(dcp, dtype=float)
    per_rank = np.asarray(batch, dtype=float) * heads * (v_dim * out_bytes + 4)
    if backend == "ag":
        return (d - 1.0) * per_rank
    if backend == "a2a":
        return (d - 1.0) / d * per_rank
    raise ValueError(f"unknown DCP backend {backend!r}")


def eval_dcp_layer(profile: dict, backend: str, batch, dcp) -> np.ndarray:
    """Seconds DCP adds to one layer's decode step at ``batch`` and ``dcp`` (0 at dcp 1): the
    communication and merge of the partial outputs, beyond the split attention itself.

    ``latency * log2(dcp) + received bytes / bandwidth + merge_per_elem * dcp * batch * heads``;
    bandwidth and merge slope come from the communication-only and merge-only timings, the
    latency from the measured whole steps. Sizes beyond those measured are extrapolated.
    """
    ref = profile["reference"]
    fit = profile["fit"][backend]
    d = np.maximum(np.asarray(dcp, dtype=float), 1.0)
    bsz = np.asarray(batch, dtype=float)
    recv = dcp_recv_bytes(backend, d, bsz, ref["heads"], ref["v_dim"])
    extra = (fit["latency_s"] * np.log2(d) + recv / fit["bandwidth_Bps"]
             + fit["merge_s_per_elem"] * d * bsz * ref["heads"])
    return np.where(d > 1.0, extra, 0.0)


# ------------------------------------------------------------------------------ loading bumped by
# clear_profile_cache, so derived caches know to refresh: with the profiles directory set in the
# environment (PROFILES_ENV), what the silicon read from the profiles depends on
# (engine_advisor.model.hardware.silicon.silicon_for, engine_advisor.model.queries.query_for)
GENERATION = [0]


def cache_generation() -> int:
    return GENERATION[0]


def clear_profile_cache() -> None:
    """Forget the profiles read so far (they are read once per directory and process)."""
    _scan.cache_clear()
    GENERATION[0] += 1


@lru_cache(maxsize=8)
def _scan(directory: Path) -> dict[tuple[str, str], list[tuple[str, dict]]]:
    try:
        files = sorted(p for p in directory.glob("*.json") if p.is_file())
    except OSError:
        files = []
    found: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    for p in files:
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("kind") not in (KIND_GPU, KIND_DCP):
            continue
        gpu = str(data.get("gpu_key", "")).upper()
        if gpu:
            found.setdefault((gpu, data["kind"]), []).append((p.name, data))
    return found


def find_profiles(gpu_name: str, kind: str = KIND_GPU,
                  engine: str | None = None) -> list[tuple[str, dict]]:
    """(file name, profile) of every profile of this kind for this GPU type, by file name: the
    profiles every engine shares (the directory's own files), or with ``engine`` that engine's
    own kernel tables (its subdirectory, ``<engine>/<file>``: what only its predictions run on,
    ``engine_advisor.model.hardware.silicon.Silicon.for_engine``)."""
    if engine is None:
        return list(_scan(profiles_dir()).get((gpu_name.upper(), kind), ()))
    if not engine.isidentifier():     # a registry name, never a path
        return []
    return [(f"{engine}/{name}", data)
            for name, data in _scan(profiles_dir() / engine).get((gpu_name.upper(), kind), ())]


def gpu_key(device_name: str, known: list[str] | tuple[str, ...]) -> str:
    """The built-in GPU type named in a device name ('NVIDIA H200' -> 'H200'), else the name."""
    tokens = device_name.upper().replace("-", " ").split()
    for name in known:
        if name.upper() in tokens:
            return name.upper()
    return device_name.strip().upper() or "UNKNOWN"


def median_rel_error(pred, obs) -> tuple[float, float]:
    """(median, max) of |pred - obs| / obs."""
    p = np.asarray(pred, dtype=float)
    o = np.asarray(obs, dtype=float)
    err = np.abs(p - o) / o
    return float(np.median(err)), float(np.max(err))


def geometric_crossover(x: np.ndarray, diff: np.ndarray) -> float | None:
    """First x where ``diff`` turns from positive to non-positive, interpolated in log x."""
    for i in range(1, len(x)):
        if diff[i - 1] > 0 >= diff[i]:
            t = diff[i - 1] / (diff[i - 1] - diff[i])
            return math.exp(math.log(x[i - 1]) + t * (math.log(x[i]) - math.log(x[i - 1])))
    return None
