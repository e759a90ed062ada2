"""Observations on disk, so that a crash does not lose what the drift loop and ``fit`` need.

``DATA_DIR/observations.csv`` is ``model/fit/dataset.py``'s CSV (``engine-advisor fit`` reads it
as it is), one row per observed request, appended by ``ObservationFile.append``:

- when: the proxy buffers new rows and a background task writes them once a second
  (``FLUSH_S``), then ``fsync``: a crash of the process loses at most the last second's rows
  (and those waiting for a disk that refuses them, below), a crash of the machine too (the
  fsync), nothing older;
- whole rows or none: a write that fails part way (a full disk: ENOSPC, EDQUOT, EFBIG; EIO)
  is cut back (``ftruncate``) to the end of the last whole row it wrote, so no row is torn and
  the next append does not glue onto a fragment. Large backlogs go in pieces of whole rows
  (``CHUNK_BYTES``), so a disk with room for some of them takes those. A failed ``fsync`` cuts
  the whole append back (what it wrote may not be on the disk) and it is retried;
- rows the disk refuses (ENOSPC, EROFS, EIO, ...) are not lost: they go back to the
  ``Observations`` they came from (engine_advisor.service.proxy.observations: at most
  ``PENDING_ROWS``, the oldest dropped and counted past that), and the next flush, a second later,
  writes them before the new ones; a graceful stop's flush too. The log names the path and the count
  when writes start failing, every ``LOG_EVERY_S`` while they do, and when they work again;
- a torn tail (a crash in the middle of a write, or a failed cut) is cut off: at start
  (``read``) and before every append, under the lock, with a log line naming the path and
  the bytes dropped;
- bounded: rows that would take the file past ``ROW_BYTES`` x the pools file's
  ``observations`` go to a new file, the full one renamed ``observations.csv.1`` (replacing
  the previous one): two files of that size at most (a single batch larger than that is
  written whole), which hold at least the rows kept in memory;
- reloaded at start (``read``): the older file, then the current one, the last rows first
  kept; lines that do not parse are skipped, and the log says how many;
- several workers (``--workers``) append to the same file under an exclusive ``flock``; each
  reloads all their rows.

The operating system calls ``_open``, ``_write``, ``_fsync`` and ``_truncate`` are attributes
of the instance, so that a test can inject a failing disk.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from engine_advisor.model.fit.dataset import DatasetError, Measurement, header_csv, parse_csv
from engine_advisor.service.proxy import observations as _observations

log = logging.getLogger("engine_advisor.proxy")

FILE = "observations.csv"
ROW_BYTES = 400          # a row is shorter (about 150 bytes): the rotation threshold per row
FLUSH_S = 1.0            # how often rows are written (and failed writes retried)
CHUNK_BYTES = 64 << 10   # a backlog is written in pieces of whole rows of about this size
LOG_EVERY_S = 60.0       # while writes fail, how often the log repeats the count waiting
SCAN_BYTES = 64 << 10    # read backwards in pieces of this size to find a torn line's start


class ObservationFile:
    def __init__(self, directory: Path, rows: int):
        self.path = directory / FILE
        self.older = directory / (FILE + ".1")
        self.resize(rows)
        self._lock = threading.Lock()     # one append at a time (the flush's thread, a stop's)
        self._failing_since: float | None = None
        self._logged_at = 0.0
        self._drops_logged = 0
        self._drops_seen = 0
        self._backlog = 0                 # rows kept in memory written by the current append
        self._cut: tuple[int, int, int] | None = None   # (inode, whole size, size left)
        self._open, self._write, self._fsync = os.open, os.write, os.fsync
        self._truncate = os.ftruncate

    def resize(self, rows: int) -> None:
        self.max_bytes = max(rows, 1) * ROW_BYTES

    # ------------------------------------------------------------------ start
    def read(self) -> list[Measurement]:
        """The rows of both files, oldest first (unreadable lines skipped, a torn last line
        cut off the file)."""
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
            if end < len(raw):
                self._repair(p, len(raw) - end)
            rows, bad = _parse(raw[:end].decode("utf-8", "replace"), str(p))
            if bad:
                log.warning("observations: %s: %d unreadable line(s) skipped", p, bad)
            out.extend(rows)
        return out

    def _repair(self, p: Path, torn: int) -> None:
        """Cut the torn last line of ``p`` off (at start), under the workers' lock."""
        try:
            fd = self._open(p, os.O_RDWR)
        except OSError as exc:
            log.warning("observations: %s: a line torn by a crash (%d bytes) skipped; cannot "
                        "cut it off (%s)", p, torn, exc.strerror)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            dropped = self._cut_torn_tail(fd, os.fstat(fd).st_size)
            if dropped:               # (none: another worker's write, finished meanwhile)
                self._fsync(fd)
                log.warning("observations: %s: a line torn by a crash cut off (%d bytes "
                            "dropped)", p, dropped)
        except OSError as exc:
            log.warning("observations: %s: a line torn by a crash (%d bytes) skipped; cannot "
                        "cut it off (%s)", p, torn, exc.strerror)
        finally:
            os.close(fd)

    def _cut_torn_tail(self, fd: int, size: int) -> int:
        """Truncate the file open at ``fd`` (locked, ``size`` bytes) after its last newline;
        the bytes dropped."""
        if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
            return 0
        keep, pos = 0, size
        while pos > 0:
            start = max(0, pos - SCAN_BYTES)
            i = os.pread(fd, pos - start, start).rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        self._truncate(fd, keep)
        return size - keep

    # ------------------------------------------------------------------ append
    def append(self, text: str) -> None:
        """Append rows (CSV lines) and fsync; rotate past ``max_bytes``. Blocking: call it in
        a thread.

        ``text`` from ``Observations.take`` (a ``Batch``): every row waiting in its
        ``Observations`` is written, those kept by earlier failed writes first, then this
        batch's; rows the disk refuses go back there, logged, and this returns normally.
        Plain text: written whole or not at all; an ``OSError`` says why."""
        owner = getattr(text, "owner", None)
        with self._lock:
            if owner is None:
                data = text.encode("utf-8", "replace")
                done, exc = self._append([(data, 1)]) if data else (0, None)
                if exc is not None:
                    raise exc
                return
            owner.writing = True     # a flush meanwhile (a stop's) waits for this one
            try:
                lines = owner.reclaim()          # this batch's rows, after any kept
                if not lines:
                    return
                self._backlog = len(lines) - len(text.lines)
                try:
                    done, exc = self._append(_chunks(lines))
                except BaseException:            # not a disk error: keep them all the same
                    owner.keep(lines)
                    raise
                if done:
                    owner.saved(done)
                if exc is None:
                    self._recovered(done)
                else:
                    self._failed(owner, lines[done:], exc)
            finally:
                owner.writing = False

    def _recovered(self, done: int) -> None:
        if self._failing_since is not None:
            log.warning("observations: %s is written again after %.0f s: %d row(s) written, "
                        "%d of them kept in memory meanwhile", self.path,
                        time.monotonic() - self._failing_since, done, self._backlog)
            self._failing_since = None
            self._drops_logged = 0

    def _failed(self, owner, rest: list[str], exc: OSError) -> None:
        owner.keep(rest, exc)
        dropped = owner.dropped - self._drops_seen
        self._drops_seen = owner.dropped
        now, bound = time.monotonic(), _observations.PENDING_ROWS
        waiting = len(owner.kept)
        if self._failing_since is None:
            self._failing_since = self._logged_at = now
            log.error("observations: cannot write %d row(s) to %s (%s): kept in memory "
                      "(%d waiting, at most %d) and retried every %g s and at a graceful stop",
                      len(rest), self.path, exc.strerror or exc, waiting, bound, FLUSH_S)
        elif (dropped and not self._drops_logged) or now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.error("observations: still cannot write to %s (%s) after %.0f s: %d row(s) "
                      "waiting in memory (at most %d); %d oldest dropped unwritten in all",
                      self.path, exc.strerror or exc, now - self._failing_since, waiting,
                      bound, owner.dropped)
        if dropped:
            self._drops_logged += dropped

    def _append(self, chunks: list[tuple[bytes, int]]) -> tuple[int, OSError | None]:
        """Append the chunks (bytes of whole rows, their number of rows) in order, under the
        lock, and fsync: (rows written and synced, the error that stopped it or None). A
        chunk is written whole or cut back off the file."""
        total = sum(len(c) for c, _ in chunks)
        fd = -1
        try:
            while True:
                fd = self._open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
                fcntl.flock(fd, fcntl.LOCK_EX)
                st = os.fstat(fd)
                try:
                    current = os.stat(self.path).st_ino == st.st_ino
                except FileNotFoundError:
                    current = False
                if current:
                    size = self._whole(fd, st)
                    if not (size and size + total > self.max_bytes):
                        break
                    os.replace(self.path, self.older)      # full: a new file for these rows
                    _sync_dir(self.path.parent)
                os.close(fd)                 # another worker rotated it meanwhile, or we did
                fd = -1
            return self._write_chunks(fd, st.st_ino, size, chunks)
        except OSError as exc:
            return 0, exc
        finally:
            if fd >= 0:
                os.close(fd)

    def _whole(self, fd: int, st: os.stat_result) -> int:
        """The file's size once a torn tail is cut off: what a failed cut left (``_cut``), or
        a line torn by a crash."""
        size, cut = st.st_size, self._cut
        if cut is not None:
            ino, whole, left = cut
            if ino == st.st_ino and size == left and whole <= size:
                self._truncate(fd, whole)        # an OSError keeps ``_cut`` for the next try
                log.warning("observations: %s: the rows of a failed write cut off (%d bytes "
                            "dropped)", self.path, size - whole)
                size = whole
            self._cut = None
        dropped = self._cut_torn_tail(fd, size)
        if dropped:
            log.warning("observations: %s: a torn line cut off the end (%d bytes dropped)",
                        self.path, dropped)
        return size - dropped

    def _write_chunks(self, fd: int, ino: int, size: int,
                      chunks: list[tuple[bytes, int]]) -> tuple[int, OSError | None]:
        head = header_csv().encode() if size == 0 else b""
        whole, rows, error = size, 0, None
        for data, n in chunks:
            try:
                self._write_all(fd, head + data)
            except OSError as exc:
                error = exc
                break
            whole += len(head) + len(data)
            rows += n
            head = b""
        if error is not None and not self._cut_back(fd, ino, whole, size):
            return 0, error        # cut back to ``size`` before the next append: all again
        if rows:
            try:
                self._fsync(fd)
            except OSError as exc:     # what was written may not be on the disk: all again
                self._cut_back(fd, ino, size, size)
                return 0, exc
            if size == 0:
                try:
                    _sync_dir(self.path.parent)            # the new file's name, durable
                except OSError as exc:
                    log.warning("observations: cannot sync the directory of %s (%s)",
                                self.path, exc.strerror)
        return rows, error

    def _cut_back(self, fd: int, ino: int, whole: int, start: int) -> bool:
        """Truncate the file to ``whole`` bytes (the end of its last whole row); if that
        fails, remember to cut it back to ``start`` (where this append began: none of its rows
        counts as written then) before the next append."""
        try:
            self._truncate(fd, whole)
            return True
        except OSError as exc:
            try:
                left = os.fstat(fd).st_size
            except OSError:
                left = -1
            self._cut = (ino, start, left)
            log.error("observations: cannot cut a partly written row off %s (%s); cut before "
                      "the next write", self.path, exc.strerror)
            return False

    def _write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._write(fd, view)
            if n <= 0:                      # (a regular file: never, but never loop on it)
                raise OSError(errno.EIO, "the write took no byte")
            view = view[n:]


def _chunks(lines: list[str]) -> list[tuple[bytes, int]]:
    """Lines grouped into pieces of about ``CHUNK_BYTES`` (bytes, rows)."""
    out: list[tuple[bytes, int]] = []
    part: list[str] = []
    size = 0
    for line in lines:
        part.append(line)
        size += len(line)
        if size >= CHUNK_BYTES:
            out.append(("".join(part).encode("utf-8", "replace"), len(part)))
            part, size = [], 0
    if part:
        out.append(("".join(part).encode("utf-8", "replace"), len(part)))
    return out


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
