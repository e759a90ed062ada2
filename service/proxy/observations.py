"""Observed requests as calibration rows (model/dataset.py's schema), in a bounded ring.

One row per successful proxied request: the upstream's engine, DCP size and memory fraction,
the workload's GPU and KV layout, the prompt and output tokens (the response's usage when it
has one), the upstream's in-flight requests when it was sent as ``batch_size``, and TTFT, TPOT
and total seconds as a client of the upstream saw them (TTFT and TPOT only when streaming).
``source`` is ``proxy:<upstream name>``. Exported as CSV by GET /v1/observations, so production
traffic can refine the model with ``engine-advisor fit``.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from model.dataset import Measurement, header_csv, row_csv


class Observation(NamedTuple):
    """One observed request (immutable; a tuple: built on every proxied request)."""

    engine: str
    upstream: str
    gpu: str
    num_gpus: int
    dcp_size: int
    mem_fraction: float
    kv_bytes_per_token: int
    kv_shards: int
    context_tokens: int
    output_tokens: int
    batch_size: int
    ttft_s: float | None
    tpot_s: float | None
    total_s: float
    model: str = ""              # the pools' preset (per-model calibration), "" otherwise
    kv_cache_dtype: str = "bf16"

    def measurement(self) -> Measurement:
        return Measurement(
            engine=self.engine, gpu=self.gpu, num_gpus=self.num_gpus, dcp_size=self.dcp_size,
            mem_fraction=self.mem_fraction, context_tokens=self.context_tokens,
            output_tokens=self.output_tokens, batch_size=self.batch_size,
            kv_bytes_per_token=self.kv_bytes_per_token, kv_shards=self.kv_shards,
            ttft_s=self.ttft_s if self.ttft_s and self.ttft_s > 0 else None,
            tpot_s=self.tpot_s if self.tpot_s and self.tpot_s > 0 else None,
            total_s=self.total_s if self.total_s > 0 else None,
            source=f"proxy:{self.upstream}", model=self.model,
            kv_cache_dtype=self.kv_cache_dtype)


class Observations:
    def __init__(self, size: int):
        self.rows: deque[Observation] = deque(maxlen=max(size, 0))
        self.total = 0

    def resize(self, size: int) -> None:
        if size != self.rows.maxlen:
            self.rows = deque(self.rows, maxlen=max(size, 0))

    def add(self, obs: Observation) -> None:
        if self.rows.maxlen:
            self.rows.append(obs)
            self.total += 1

    def csv(self) -> str:
        return header_csv() + "".join(row_csv(o.measurement()) for o in list(self.rows))
