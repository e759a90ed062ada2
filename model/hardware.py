"""GPU specs (spec sheets, reference.md section 6) and the KV-read time model.

The cost model's KV-read feature is "seconds to read these bytes on this GPU". By default that
is bytes / spec-sheet HBM bandwidth; a measured hardware profile (calibration/profiles/*.json)
replaces it when one matches the GPU, and every prediction says which was used.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import ConfigDict, Field

from model.hwprofile import (
    KIND_DCP,
    KIND_GPU,
    cache_generation,
    eval_dcp_layer,
    eval_read_curve,
    find_profile,
    profiles_dir,
)
from model.jsonnum import JsonModel

GB = 1e9
TB = 1e12


class GpuSpec(JsonModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=64, description="GPU type name")]
    memory_bytes: Annotated[float, Field(gt=1e9, lt=1e13, allow_inf_nan=False,
                                         description="memory per GPU in bytes")]
    hbm_bandwidth: Annotated[float, Field(gt=1e10, lt=1e15, allow_inf_nan=False,
                                          description="HBM bandwidth per GPU in bytes/s")]
    nvlink_bandwidth: Annotated[float | None, Field(gt=0, lt=1e14, allow_inf_nan=False,
                                                    description="NVLink bytes/s per GPU")] = None


BUILTIN_GPUS: dict[str, GpuSpec] = {
    "H100": GpuSpec(name="H100", memory_bytes=80 * GB, hbm_bandwidth=3.35 * TB,
                    nvlink_bandwidth=900 * GB),
    "H200": GpuSpec(name="H200", memory_bytes=141 * GB, hbm_bandwidth=4.8 * TB,
                    nvlink_bandwidth=900 * GB),
    "B200": GpuSpec(name="B200", memory_bytes=180 * GB, hbm_bandwidth=8 * TB,
                    nvlink_bandwidth=1800 * GB),
    "B300": GpuSpec(name="B300", memory_bytes=288 * GB, hbm_bandwidth=8 * TB,
                    nvlink_bandwidth=1800 * GB),
}


def builtin_gpu(name: str) -> GpuSpec:
    spec = BUILTIN_GPUS.get(name.upper())
    if spec is None:
        raise KeyError(name)
    return spec


class KvReadModel:
    """Seconds to read ``nbytes`` of KV per GPU per decode step.

    The spec-sheet fallback is linear at peak bandwidth; a profile supplies a measured curve.
    """

    source = "spec"

    def __init__(self, gpu: GpuSpec):
        self.gpu = gpu

    def seconds(self, nbytes: np.ndarray) -> np.ndarray:
        return np.asarray(nbytes, dtype=float) / self.gpu.hbm_bandwidth


class ProfileKvReadModel(KvReadModel):
    """KV-read seconds from a measured hardware profile: t(bytes) = the profile's monotone read
    curve (fixed per-call overhead, then effective bandwidth rising with the bytes read, then
    the asymptotic bandwidth of the largest reads); see model.hwprofile."""

    def __init__(self, gpu: GpuSpec, file_name: str, profile: dict):
        super().__init__(gpu)
        self.source = f"profile:{file_name}"
        self.file_name = file_name
        self.curve = profile["kv_read"]
        self.asymptotic_bandwidth = float(self.curve["asymptotic_Bps"])

    def seconds(self, nbytes: np.ndarray) -> np.ndarray:
        return eval_read_curve(self.curve, np.atleast_1d(np.asarray(nbytes, dtype=float))
                               ).reshape(np.shape(nbytes))


def _valid_curve(curve) -> bool:
    try:
        kb, kt = np.asarray(curve["bytes"], float), np.asarray(curve["seconds"], float)
        return (len(kb) >= 1 and len(kb) == len(kt) and bool(np.all(np.diff(kb) > 0))
                and bool(np.all(np.diff(kt) > 0)) and float(curve["overhead_s"]) >= 0
                and float(curve["asymptotic_Bps"]) > 0 and bool(np.all(kt > 0)))
    except (KeyError, TypeError, ValueError):
        return False


_MODELS: dict[tuple, object] = {}


def _cached(kind: str, gpu: GpuSpec, build):
    """Per-process cache of the models derived from profiles (hot path of every prediction),
    keyed by GPU, profile directory and the profile cache generation."""
    key = (kind, gpu, str(profiles_dir()), cache_generation())
    try:
        return _MODELS[key]
    except KeyError:
        if len(_MODELS) > 256:
            _MODELS.clear()
        value = _MODELS[key] = build(gpu)
        return value


def kv_read_model(gpu: GpuSpec) -> KvReadModel:
    """The KV-read model for a GPU: its measured profile when one is installed, else the spec."""
    return _cached("kv", gpu, _build_kv_read_model)


def _build_kv_read_model(gpu: GpuSpec) -> KvReadModel:
    found = find_profile(gpu.name, KIND_GPU)
    if found is not None and _valid_curve(found[1].get("kv_read")):
        return ProfileKvReadModel(gpu, *found)
    return KvReadModel(gpu)


class DcpCommModel:
    """Measured DCP combine cost on one GPU type (a ``calibrate dcp`` profile).

    ``seconds(batch, dcp)``: what DCP adds to one decode step of the profile's reference model
    (its layer count x one layer's communication + merge, the engines' default backend).
    ``sequence_equivalents(batch, dcp)``: the same in units of the marginal cost of one sequence
    at dcp 2, the unit of the estimator's combine feature batch * (dcp - 1) / dcp, so that the
    engines' fitted coefficient applies to the measured shape in batch and dcp.
    """

    def __init__(self, file_name: str, profile: dict):
        self.source = f"profile:{file_name}"
        self.file_name = file_name
        self.profile = profile
        self.backend = profile["default_backend"]
        self.layers = int(profile["reference"]["layers"])
        self.measured = list(profile.get("dcp_sizes_measured", []))
        one = self.layer_seconds(np.array([1.0]), np.array([2.0]))[0]
        two = self.layer_seconds(np.array([2.0]), np.array([2.0]))[0]
        self.unit_s = 2.0 * (two - one)     # one sequence-equivalent at dcp 2 = half a sequence

    def layer_seconds(self, batch, dcp) -> np.ndarray:
        return eval_dcp_layer(self.profile, self.backend, batch, dcp)

    def seconds(self, batch, dcp) -> np.ndarray:
        return self.layers * self.layer_seconds(batch, dcp)

    def sequence_equivalents(self, batch, dcp) -> np.ndarray:
        return self.layer_seconds(batch, dcp) / self.unit_s


def dcp_comm_model(gpu: GpuSpec) -> DcpCommModel | None:
    """The measured DCP model of a GPU type, or None (the spec shape is used)."""
    return _cached("dcp", gpu, _build_dcp_comm_model)


def _build_dcp_comm_model(gpu: GpuSpec) -> DcpCommModel | None:
    found = find_profile(gpu.name, KIND_DCP)
    if found is None:
        return None
    try:
        model = DcpCommModel(*found)
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return model if model.unit_s > 0 and np.isfinite(model.unit_s) else None


def dcp_comm_seconds(gpu: GpuSpec, batch, dcp) -> np.ndarray | None:
    """Seconds DCP's combine adds per decode step (reference model), from the GPU's measured
    DCP profile; None when the GPU has none."""
    model = dcp_comm_model(gpu)
    return None if model is None else model.seconds(batch, dcp)
