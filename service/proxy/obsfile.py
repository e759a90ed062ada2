"""Observations on disk, so that a crash does not lose what the drift loop and ``fit`` need.

``DATA_DIR/observations.csv`` is ``model/fit/dataset.py``'s CSV (``engine-advisor fit`` reads it
as it is), one row per observed request, appended by ``ObservationFile.append``:

- when: the proxy buffers new rows and a background task writes them once a second
  (``FLUSH_S``), one ``write`` per batch, then ``fsync``: a crash of the process loses at most
  the last second's rows, a crash of the machine too (the fsync), nothing older;
- bounded: rows that would take the file past ``ROW_BYTES`` x the pools file's
  ``observations`` go to a new file, the full one renamed ``observations.csv.1`` (replacing
  the previous one): two files of that size at most (a single batch larger than that is
  written whole), which hold at least the rows kept in memory;
- reloaded at start (``read``): the older file, then the current one, the last rows first
  kept; a line torn by a crash (after the last newline) and lines that do not parse are
  skipped, and the log says how many;
- several workers (``--workers``) append to the same file under an exclusive ``flock``; each
  reloads all their rows.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from model.fit.dataset import DatasetError, Measurement, header_csv, parse_csv

log = logging.getLogger("engine_advisor.proxy")

FILE = "observations.csv"
ROW_BYTES = 400          # a row is shorter (about 150 bytes): the rotation threshold per row
FLUSH_S = 1.0


class ObservationFile:
    def __init__(self, directory: Path, rows: int):
        self.path = directory / FILE
        self.older = directory / (FILE + ".1")
        self.resize(rows)

    def resize(self, rows: int) -> None:
        self.max_bytes = max(rows, 1) * ROW_BYTES

    def read(self) -> list[Measurement]:
        """The rows of both files, oldest first (unreadable lines skipped)."""
        out: list[Measurement] = []
        for p in (self.older, self.path):
            try:
                raw = p.read_bytes()
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.error("observations: cannot read %s (%s); starting without it", p,
                          exc.strerror)
                continue
            end = raw.rfind(b"\n") + 1
            rows, bad = _parse(raw[:end].decode("utf-8", "replace"), str(p))
            if bad or end < len(raw):
                log.warning("observations: %s: %d unreadable line(s) skipped%s", p, bad,
                            " and a line torn by a crash" if end < len(raw) else "")
            out.extend(rows)
        return out

    def append(self, text: str) -> None:
        """Append rows (CSV lines) and fsync; rotate past ``max_bytes``. Blocking: call it in
        a thread."""
        data = text.encode("utf-8")
        while True:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                st = os.fstat(fd)
                try:
                    current = os.stat(self.path).st_ino == st.st_ino
                except FileNotFoundError:
                    current = False
                if not current:          # another worker rotated it meanwhile: reopen
                    continue
                if st.st_size and st.st_size + len(data) > self.max_bytes:
                    os.replace(self.path, self.older)      # full: a new file for these rows
                    _sync_dir(self.path.parent)
                    continue
                head = header_csv().encode() if st.st_size == 0 else b""
                _write_all(fd, head + data)
                os.fsync(fd)
                if st.st_size == 0:
                    _sync_dir(self.path.parent)            # the new file's name, durable
                return
            finally:
                os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _sync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parse(text: str, source: str) -> tuple[list[Measurement], int]:
    """(rows, lines skipped) of a dataset CSV text."""
    if not text.strip():
        return [], 0
    try:
        return parse_csv(text, source), 0
    except DatasetError:
        pass
    lines = text.splitlines()
    header, rows, bad = lines[0], [], 0
    for line in _nonblank(lines[1:]):
        try:
            rows.extend(parse_csv(header + "\n" + line, source))
        except DatasetError:
            bad += 1
    return rows, bad


def _nonblank(lines: Iterable[str]) -> Iterable[str]:
    return (ln for ln in lines if ln.strip())
