"""Observed requests as calibration rows (model/fit/dataset.py's schema), in a bounded ring.

One row per successful proxied request: the upstream's engine, DCP size and memory fraction,
the workload's GPU and KV layout, the prompt and output tokens (the response's usage when it
has one), the upstream's in-flight requests when it was sent as ``batch_size``, and TTFT, TPOT
and total seconds as a client of the upstream saw them (TTFT and TPOT only when streaming).
``source`` is ``proxy:<upstream name>``. Exported as CSV by GET /v1/observations, so production
traffic can refine the model with ``engine-advisor fit``.

With a data directory (``serve --data-dir``), rows are also appended to a file there
(engine_advisor.service.proxy.obsfile: written every second and fsynced, rotated, reloaded at
start); the proxy's hot path only appends each row to a list (``unsaved``) that the flush takes
(``take``).

``take`` moves the new rows to ``kept``, the rows waiting for the file, and the file's
``ObservationFile.append`` (in a thread) takes all of them (``reclaim``) and gives back those
the disk refuses (``keep``: a full, read-only or failing disk): at most ``PENDING_ROWS`` wait,
the oldest dropped and counted past that. While any wait (or a write that may give some back
runs), ``unsaved`` is true even with no new row, so the flush that runs every second, and the
one of a graceful stop, tries them again; rows taken by a flush that a stop cancelled are
written by the stop's. ``export`` publishes the counts as Prometheus metrics
(``ObservationMetrics``: pending, dropped, written, write errors by errno).
"""

from __future__ import annotations

import errno
import threading
from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine_advisor.model.fit.dataset import Measurement, header_csv, row_csv

# Rows waiting for the disk (kept in memory after a failed write): CSV lines of about 100
# characters, about 150 bytes each in memory, so about 15 MB at most. Past it the oldest are
# dropped (and counted).
PENDING_ROWS = 100_000


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


class Batch(str):
    """What ``Observations.take`` hands to the file: a str, the new rows' CSV lines, with each
    row's line (``lines``) and the ``Observations`` (``owner``) whose waiting rows, these
    among them, the file's ``append`` takes (``reclaim``) and gives back if they fail
    (``keep``)."""

    lines: list[str]
    owner: Observations

    def __new__(cls, lines: list[str], owner: Observations) -> Batch:
        self = super().__new__(cls, "".join(lines))
        self.lines, self.owner = lines, owner
        return self


class Unsaved(list):
    """The rows added since the last ``take``; true also while rows a failed write kept wait,
    or while a write that may give rows back runs (so that the flush, which runs only when
    this is true, retries them, a stop's flush too)."""

    __slots__ = ("owner",)

    def __init__(self, owner: Observations, rows=()):
        super().__init__(rows)
        self.owner = owner

    def __bool__(self) -> bool:
        o = self.owner
        return len(self) > 0 or bool(o.kept) or o.writing


class Observations:
    def __init__(self, size: int):
        self.rows: deque[Observation] = deque(maxlen=max(size, 0))
        self.total = 0
        self._unsaved: Unsaved | None = None          # a list once a file keeps them
        # rows (CSV lines) a failed write gave back, oldest first; ``keep`` and ``reclaim``
        # run in the file's writer thread, the scrape on the event loop: under ``_lock``
        self.kept: deque[str] = deque()
        self.writing = False         # the file's writer thread holds rows it may give back
        self._lock = threading.Lock()
        self.dropped = 0             # rows dropped past PENDING_ROWS
        self.written = 0             # rows written to the file
        self.errors: dict[str, int] = {}      # failed writes by errno name

    @property
    def unsaved(self) -> Unsaved | None:
        return self._unsaved

    @unsaved.setter
    def unsaved(self, rows: list[Observation] | None) -> None:
        """``[]``: a file keeps the rows from now on; ``None``: memory only."""
        self._unsaved = None if rows is None else Unsaved(self, rows)

    def resize(self, size: int) -> None:
        if size != self.rows.maxlen:
            self.rows = deque(self.rows, maxlen=max(size, 0))

    def add(self, obs: Observation) -> None:
        if self.rows.maxlen:
            self.rows.append(obs)
            self.total += 1
            if self._unsaved is not None:
                self._unsaved.append(obs)

    def restore(self, rows: list[Measurement]) -> None:
        """Rows read back from the file at start, oldest first (the last ones are kept)."""
        keep = self.rows.maxlen or 0
        for m in rows[-keep:] if keep else ():
            self.rows.append(Observation.of(m))

    def take(self) -> Batch:
        """The rows added since the last ``take``, as CSV lines (no header). They join the
        rows waiting for the file (``kept``), which its ``append`` writes, all of them: a
        flush that never ran (cancelled by a stop) loses none."""
        if self._unsaved is None:                   # memory only: nothing to write
            return Batch([], self)
        rows, self._unsaved = self._unsaved, Unsaved(self)
        lines = [row_csv(o.measurement()) for o in rows]
        with self._lock:
            self.kept.extend(lines)
            self._bound()
        return Batch(lines, self)

    # ------------------------------------------------------------ rows waiting for the disk
    def reclaim(self) -> list[str]:
        """The rows waiting for the file (oldest first), taken out to be written."""
        with self._lock:
            lines = list(self.kept)
            self.kept.clear()
        return lines

    def keep(self, lines: list[str], error: OSError | None = None) -> int:
        """Rows (oldest first) a write could not take, kept before those waiting since; past
        ``PENDING_ROWS`` the oldest are dropped. Returns how many were dropped now."""
        with self._lock:
            self.kept.extendleft(reversed(lines))
            if error is not None:
                name = errno_name(error)
                self.errors[name] = self.errors.get(name, 0) + 1
            return self._bound()

    def _bound(self) -> int:
        over = len(self.kept) - PENDING_ROWS
        for _ in range(over):
            self.kept.popleft()
        self.dropped += max(over, 0)
        return max(over, 0)

    def saved(self, n: int) -> None:
        """``n`` rows written to the file (its writer thread: a plain counter)."""
        self.written += n

    @property
    def pending(self) -> int:
        """Rows not on disk yet: new ones and those kept after a failed write."""
        return len(self._unsaved or ()) + len(self.kept)

    def export(self, registry: CollectorRegistry) -> ObservationMetrics:
        """Publish the file's counts in ``registry`` (engine_advisor.service.proxy.metrics'
        registry)."""
        return ObservationMetrics(self, registry)

    def csv(self) -> str:
        return header_csv() + "".join(row_csv(o.measurement()) for o in list(self.rows))


def errno_name(exc: OSError) -> str:
    """A bounded label for a failed write: ENOSPC, EROFS, EIO, EDQUOT, ... or 'other'."""
    name = errno.errorcode.get(exc.errno or 0, "")
    return name if name in ERRNO_LABELS else "other"


ERRNO_LABELS = frozenset({"ENOSPC", "EDQUOT", "EROFS", "EIO", "EFBIG", "EACCES", "EPERM",
                          "ENOENT", "ENOTDIR", "EISDIR", "EMFILE", "ENFILE", "ESTALE"})

PENDING = ("engine_advisor_proxy_observations_pending",
           "observation rows not on disk yet (--data-dir): new since the last flush, and those "
           "kept in memory after a failed write")
DROPPED = ("engine_advisor_proxy_observations_dropped",
           f"observation rows dropped unwritten: more than {PENDING_ROWS:,} waited for the disk")
WRITTEN = ("engine_advisor_proxy_observations_written",
           "observation rows appended to the observations file")
ERRORS = ("engine_advisor_proxy_observation_write_errors",
          "failed writes of the observations file (each retried), by errno")


class ObservationMetrics(Collector):
    """The observations file's counts, read when scraped (like engine_advisor.service.proxy.metrics'
    ``InFlight``)."""

    def __init__(self, observations: Observations, registry: CollectorRegistry | None = None):
        self.observations = observations
        if registry is not None:
            registry.register(self)

    def collect(self) -> Iterator[Metric]:
        o = self.observations
        yield GaugeMetricFamily(*PENDING, value=o.pending)
        yield CounterMetricFamily(*DROPPED, value=o.dropped)
        yield CounterMetricFamily(*WRITTEN, value=o.written)
        errors = CounterMetricFamily(*ERRORS, labels=["errno"])
        with o._lock:
            counts = sorted(o.errors.items())
        for name, n in counts:
            errors.add_metric([name], n)
        yield errors

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(*PENDING)
        yield CounterMetricFamily(*DROPPED)
        yield CounterMetricFamily(*WRITTEN)
        yield CounterMetricFamily(*ERRORS, labels=["errno"])
