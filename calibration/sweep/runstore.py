"""The run folder of a sweep: ``manifest.json``, ``dataset.csv``, ``samples.jsonl``,
``events.jsonl``.

Durability rules:

- ``dataset.csv`` is the record of finished points. Each row is one ``write`` of a whole line,
  flushed and fsynced before the next point starts. Its ``source`` cell carries the point key, so
  resuming needs nothing else.
- A kill can leave at most a torn last line (no newline, or a line that does not parse); opening
  the store cuts it off (``repaired`` says so).
- ``samples.jsonl`` (per-request measurements) is written before the point's dataset row; on
  opening, lines of points without a dataset row are dropped, so a point re-run after a kill
  never appears twice.
- ``manifest.json`` is replaced atomically (``engine_advisor.model.diskio.atomic_write``).
- A full or read-only disk raises ``engine_advisor.model.errors.DiskError`` naming the file and the
  cause;
  an append the disk refused part-way is cut back off, so nothing torn is left for the next
  append to join.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.model.diskio import atomic_write
from engine_advisor.model.errors import DiskError
from engine_advisor.model.fit.dataset import (
    SWEEP_SOURCE,
    DatasetError,
    Measurement,
    header_csv,
    parse_csv,
    row_csv,
)

DATASET = "dataset.csv"
MANIFEST = "manifest.json"
SAMPLES = "samples.jsonl"
EVENTS = "events.jsonl"


@dataclass(frozen=True, order=True)
class PointKey:
    """What identifies one point of a sweep (the repeat index included)."""

    engine: str
    dcp_size: int
    mem_fraction: float
    context_tokens: int
    batch_size: int
    output_tokens: int
    repeat: int

    def text(self) -> str:
        return (f"{self.engine}:dcp={self.dcp_size}:mem={self.mem_fraction:g}"
                f":ctx={self.context_tokens}:batch={self.batch_size}:out={self.output_tokens}"
                f":rep={self.repeat}")

    @classmethod
    def parse(cls, text: str) -> PointKey:
        engine, *parts = text.split(":")
        kv = dict(p.split("=", 1) for p in parts)
        return cls(engine, int(kv["dcp"]), float(kv["mem"]), int(kv["ctx"]), int(kv["batch"]),
                   int(kv["out"]), int(kv["rep"]))

    def source(self) -> str:
        return SWEEP_SOURCE + self.text()


def key_of_row(m: Measurement) -> PointKey | None:
    if not m.source.startswith(SWEEP_SOURCE):
        return None
    try:
        return PointKey.parse(m.source[len(SWEEP_SOURCE):])
    except (KeyError, ValueError):
        return None


class RunStoreError(CalibrationError, ValueError):
    """A run folder that cannot be used (different sweep, corrupt dataset)."""


def sweep_id(params: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]


def _fsync_append(path: Path, data: bytes) -> None:
    """Append ``data`` whole, or not at all: a write the disk refuses part-way (full) is cut
    back off, and the error (``DiskError``) names the file and the cause."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise DiskError.of(path, exc) from None
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        except OSError as exc:
            with contextlib.suppress(OSError):     # no torn line for the next append to join
                os.ftruncate(fd, size)
            raise DiskError.of(path, exc) from None
    finally:
        os.close(fd)


class RunStore:
    """Open (or create) a run folder for the sweep described by ``params``."""

    def __init__(self, folder: str | Path, params: dict[str, Any]):
        self.folder = Path(folder)
        self.params = params
        self.id = sweep_id(params)
        self.repaired: list[str] = []
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DiskError.of(self.folder, exc, "cannot create the run folder") from None
        self.manifest = self._open_manifest()
        self.rows: list[Measurement] = self._open_dataset()
        self.done: set[PointKey] = {k for k in map(key_of_row, self.rows) if k is not None}
        self._clean_samples()

    # ------------------------------------------------------------------ opening
    @property
    def dataset_path(self) -> Path:
        return self.folder / DATASET

    def _open_manifest(self) -> dict[str, Any]:
        path = self.folder / MANIFEST
        if path.exists():
            try:
                old = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise RunStoreError(f"{path}: unreadable manifest ({exc}); use another --out "
                                    "folder") from None
            if old.get("sweep_id") != self.id:
                diff = _param_diff(old.get("parameters", {}), self.params)
                raise RunStoreError(
                    f"{self.folder} holds a different sweep ({diff}); re-run with the same "
                    "parameters to resume it, or choose another --out folder")
            return old
        if (self.folder / DATASET).exists():
            raise RunStoreError(f"{self.folder} has a {DATASET} but no {MANIFEST}: not a run "
                                "folder of `calibrate run`; choose another --out folder")
        manifest = {"sweep_id": self.id, "parameters": self.params,
                    "created": utc_now(), "engines": {}, "runs": []}
        self._write_manifest(manifest)
        return manifest

    def _open_dataset(self) -> list[Measurement]:
        path = self.dataset_path
        if not path.exists():
            _fsync_append(path, header_csv().encode())
            return []
        raw = path.read_bytes()
        if not raw.endswith(b"\n") and raw:
            cut = raw.rfind(b"\n") + 1
            self.repaired.append(f"{path}: dropped a torn last line ({len(raw) - cut} bytes "
                                 "without a newline)")
            raw = raw[:cut]
        lines = raw.decode("utf-8", errors="replace").splitlines(keepends=True)
        if not lines:               # killed between creating the file and writing its header
            lines = [header_csv()]
        rows, keep = [], [lines[0]]
        if lines[0] != header_csv():
            raise RunStoreError(f"{path}:1: unexpected header; this folder was not written by "
                                "this version of `calibrate run` (`calibrate rebuild` brings an "
                                "older one's columns up to date)")
        for i, line in enumerate(lines[1:], start=2):
            try:
                (row,) = parse_csv(header_csv() + line, str(path))
            except (DatasetError, ValueError) as exc:
                if i == len(lines):   # only the last line may be torn by a kill
                    self.repaired.append(f"{path}:{i}: dropped an unparseable last line ({exc})")
                    continue
                raise RunStoreError(f"{path}:{i}: corrupt row in the middle of the dataset "
                                    f"({exc}); fix or remove it by hand") from None
            rows.append(row)
            keep.append(line)
        text = "".join(keep).encode()
        if text != raw or self.repaired:
            atomic_write(path, text)
        return rows

    def _clean_samples(self) -> None:
        path = self.folder / SAMPLES
        if not path.exists():
            return
        done = {k.text() for k in self.done}
        keep, dropped = [], 0
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
                ok = rec.get("key") in done
            except json.JSONDecodeError:
                ok = False
            if ok:
                keep.append(line + "\n")
            else:
                dropped += 1
        if dropped:
            self.repaired.append(f"{path}: dropped {dropped} sample lines of unfinished points")
            atomic_write(path, "".join(keep).encode())

    # ------------------------------------------------------------------ writing
    def _write_manifest(self, manifest: dict[str, Any]) -> None:
        data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        atomic_write(self.folder / MANIFEST, data)

    def update_manifest(self, **changes: Any) -> None:
        self.manifest.update(changes)
        self._write_manifest(self.manifest)

    def record_engine(self, label: str, info: dict[str, Any]) -> None:
        """Engine version, server arguments, launch log of one (dcp, mem) combination."""
        self.manifest.setdefault("engines", {})[label] = info
        self._write_manifest(self.manifest)

    def append_point(self, key: PointKey, row: Measurement, samples: list[dict[str, Any]]) -> None:
        if key in self.done:
            raise RunStoreError(f"point {key.text()} is already recorded")
        if samples:
            data = "".join(json.dumps({"key": key.text(), **s}, sort_keys=True) + "\n"
                           for s in samples)
            _fsync_append(self.folder / SAMPLES, data.encode())
        _fsync_append(self.dataset_path, row_csv(row).encode())
        self.rows.append(row)
        self.done.add(key)

    def record_point(self, key: PointKey, started: str, finished: str, attempts: int) -> None:
        """A recorded point's wall-clock start (its first attempt's) and end (its last
        attempt's), UTC, in ``manifest.json`` under ``points``: a JIT line of the engine's log
        can be matched to the point it hit."""
        self.manifest.setdefault("points", {})[key.text()] = {
            "started": started, "finished": finished, "attempts": attempts}
        self._write_manifest(self.manifest)

    def event(self, kind: str, message: str, **fields: Any) -> None:
        rec = {"time": utc_now(), "kind": kind, "message": message, **fields}
        _fsync_append(self.folder / EVENTS, (json.dumps(rec, sort_keys=True) + "\n").encode())


def utc_now(timespec: str = "seconds") -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec=timespec)


def _param_diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    diffs = [f"{k}: {old.get(k)!r} there, {new.get(k)!r} now"
             for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return "; ".join(diffs) or "same parameters, different sweep id"
