"""Observed requests as calibration rows (model/fit/dataset.py's schema), in a bounded ring.

One row per successful proxied request: the upstream's engine, DCP size and memory fraction,
the workload's GPU and KV layout, the prompt and output tokens (the response's usage when it
has one), the upstream's in-flight requests when it was sent as ``batch_size``, and TTFT, TPOT
and total seconds as a client of the upstream saw them (TTFT and TPOT only when streaming).
``source`` is ``proxy:<upstream name>``. Exported as CSV by GET /v1/observations, so production
traffic can refine the model with ``engine-advisor fit``.

With a data directory (``serve --data-dir``), rows are also appended to a file there
(service.proxy.obsfile: written every second and fsynced, rotated, reloaded at start); the
proxy's hot path only appends each row to a list (``unsaved``) that ``flush`` takes.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from model.fit.dataset import Measurement, header_csv, row_csv


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


    @classmethod
    def of(cls, m: Measurement) -> Observation:
        """The observation a row of the observations file came from (``measurement``'s
        inverse)."""
        return cls(m.engine, m.source.removeprefix("proxy:"), m.gpu, m.num_gpus, m.dcp_size,
                   m.mem_fraction, m.kv_bytes_per_token, m.kv_shards, m.context_tokens,
                   m.output_tokens, m.batch_size, m.ttft_s, m.tpot_s, m.total_s or 0.0,
                   m.model, m.kv_cache_dtype)


class Observations:
    def __init__(self, size: int):
        self.rows: deque[Observation] = deque(maxlen=max(size, 0))
        self.total = 0
        self.unsaved: list[Observation] | None = None   # a list once a file keeps them

    def resize(self, size: int) -> None:
        if size != self.rows.maxlen:
            self.rows = deque(self.rows, maxlen=max(size, 0))

    def add(self, obs: Observation) -> None:
        if self.rows.maxlen:
            self.rows.append(obs)
            self.total += 1
            if self.unsaved is not None:
                self.unsaved.append(obs)

    def restore(self, rows: list[Measurement]) -> None:
        """Rows read back from the file at start, oldest first (the last ones are kept)."""
        keep = self.rows.maxlen or 0
        for m in rows[-keep:] if keep else ():
            self.rows.append(Observation.of(m))

    def take(self) -> str:
        """The rows added since the last ``take``, as CSV lines (no header)."""
        rows, self.unsaved = self.unsaved, []
        return "".join(row_csv(o.measurement()) for o in rows or ())

    def csv(self) -> str:
        return header_csv() + "".join(row_csv(o.measurement()) for o in list(self.rows))
