"""Step durations from the cost model: prefill of a batch and one decode step of the running set.

One ``CostModel.predict`` call per scheduler step with length-1 arrays; the scheduler never
asks per token or per request.
"""

from __future__ import annotations

import numpy as np

from model.costmodel import CostModel, Query, dcp_combine_features, kv_read_seconds
from model.hardware import GpuSpec, kv_read_model


class StepTimer:
    """Unscaled seconds of prefill and decode steps of one engine configuration."""

    def __init__(self, model: CostModel, engine: str, gpu: GpuSpec, kv_bytes_per_token: float,
                 kv_shards: int = 1, dcp: int = 1):
        if engine not in model.engines:
            raise ValueError(f"the cost model has no coefficients for engine {engine!r} "
                             f"(it has {', '.join(model.engine_names)})")
        self.model = model
        self.engine_index = np.array([model.engine_names.index(engine)])
        self.gpu, self.read = gpu, kv_read_model(gpu)
        self.kv_per_gpu = np.array([float(kv_bytes_per_token) / kv_shards])
        self.dcp = np.array([float(dcp)])

    def _predict(self, context: float, output: float, batch: float):
        ctx, out = np.array([float(context)]), np.array([float(output)])
        b = np.array([float(batch)])
        read = kv_read_seconds(self.read, ctx, out, b, self.kv_per_gpu, self.dcp)
        # the GPU's measured DCP profile shapes the combine cost, as in model.recommend
        return self.model.predict(Query(self.engine_index, ctx, out, b, self.kv_per_gpu,
                                        self.dcp, read, dcp_combine_features(self.gpu, b,
                                                                             self.dcp)))

    def prefill_s(self, batch: int, context: float) -> float:
        """Prefill (TTFT) of ``batch`` sequences of ``context`` prompt tokens each."""
        return float(self._predict(max(context, 1.0), 1.0, max(batch, 1)).prefill[0])

    def step_s(self, batch: int, context: float) -> float:
        """One decode step of ``batch`` running sequences at mean context ``context``."""
        return float(self._predict(max(context, 1.0), 0.0, max(batch, 1)).tpot[0])
