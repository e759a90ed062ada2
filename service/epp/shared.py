"""In-flight counts that every picker worker sees: with ``serve --workers N`` the gateway's
connections are spread over N processes, each deciding for its own streams; each publishes
how many of its picked requests are in flight to each upstream, and adds the others' to the
counts its decisions (and its proxy, and its /metrics) read.

The table is a file ``serve`` creates for its workers (``ENV`` names it; removed when serve
exits), mapped by every worker: a header, then one slot per worker, each
``[pid, pools tag, count of upstream 0, count of upstream 1, ...]`` as native int64. A worker
claims the first slot it can lock (``fcntl.lockf``, released when it dies) and is the only
writer of it, so no write needs a lock; a reader adds the slots of live workers (their pid
answers ``kill(pid, 0)``) that loaded the same pools file (the tag: its sha256), upstream by
upstream in the file's order. Upstreams past ``COLUMNS`` are counted per worker only.

``Local`` is the same interface for one process (nothing to share).
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
from pathlib import Path

log = logging.getLogger("engine_advisor.epp")

ENV = "ENGINE_ADVISOR_EPP_COUNTS"
COLUMNS = 1024
WORD = 8
HEAD = 2                     # slot words before the counts: pid, pools tag
SLOT = (HEAD + COLUMNS) * WORD
MAGIC = 0x45505031           # "EPP1"


def create(path: Path, workers: int) -> None:
    """The empty table for ``workers`` slots (``serve`` does this before its workers start)."""
    with open(path, "wb") as f:
        f.write(MAGIC.to_bytes(WORD, "little") + workers.to_bytes(WORD, "little"))
        f.truncate(WORD * 2 + SLOT * workers)


def _tag(pools) -> int:
    return int.from_bytes(bytes.fromhex(pools.sha256[:16]), "little", signed=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Local:
    """One process: its counts are all there is."""

    def add(self, pools, up, delta: int) -> None:
        pass

    def sync(self, pools) -> None:
        pass

    def close(self) -> None:
        pass


class Shared:
    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDWR)
        size = os.fstat(self.fd).st_size
        self.map = mmap.mmap(self.fd, size)
        words = memoryview(self.map).cast("q")
        if words[0] != MAGIC:
            raise RuntimeError(f"{ENV}={path}: not an in-flight table")
        self.workers = words[1]
        self.words = words
        self.mine = self._claim()
        self.tag: int | None = None
        self.generation: int | None = None
        self.column: dict[int, int] = {}     # id(upstream) -> its column, this generation
        self.own: dict[int, int] = {}        # id(upstream) -> this worker's picks in flight
        self.added: dict[int, tuple[object, int]] = {}   # id -> (upstream, others' added)

    def _base(self, slot: int) -> int:
        return 2 + slot * (HEAD + COLUMNS)

    def _claim(self) -> int:
        for slot in range(self.workers):
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, SLOT, WORD * 2 + SLOT * slot)
            except OSError:
                continue
            base = self._base(slot)
            self.words[base:base + HEAD + COLUMNS] = memoryview(
                bytes(SLOT)).cast("q")
            self.words[base] = os.getpid()
            return slot
        raise RuntimeError(f"{ENV}: all {self.workers} slots are taken")

    def _layout(self, pools) -> None:
        """A new pools generation: columns in the file's order, this slot rewritten."""
        self.generation = pools.generation
        self.tag = _tag(pools)
        self.column = {id(u): i for i, u in enumerate(pools.upstreams) if i < COLUMNS}
        base = self._base(self.mine)
        words = self.words
        words[base + 1] = self.tag
        for i, u in enumerate(pools.upstreams[:COLUMNS]):
            words[base + HEAD + i] = self.own.get(id(u), 0)

    def add(self, pools, up, delta: int) -> None:
        """This worker picked ``up`` for a request (+1) or one such request ended (-1)."""
        key = id(up)
        self.own[key] = n = self.own.get(key, 0) + delta
        if not n:
            del self.own[key]
        if pools is None:
            return
        if pools.generation != self.generation:
            self._layout(pools)
        col = self.column.get(key)
        if col is not None:
            self.words[self._base(self.mine) + HEAD + col] = n

    def sync(self, pools) -> None:
        """Add the other workers' in-flight picks to each upstream's ``in_flight``."""
        if pools is None:
            return
        if pools.generation != self.generation:
            self._layout(pools)
        words, tag = self.words, self.tag
        others = []
        for slot in range(self.workers):
            base = self._base(slot)
            if slot != self.mine and words[base + 1] == tag and _alive(words[base]):
                others.append(base + HEAD)
        seen = {}
        for u in pools.upstreams:
            col = self.column.get(id(u))
            n = sum(words[b + col] for b in others) if col is not None else 0
            before = self.added.pop(id(u), (u, 0))[1]
            if n != before:
                u.in_flight += n - before
            if n:
                seen[id(u)] = (u, n)
        for u, n in self.added.values():     # upstreams the pools no longer have
            u.in_flight -= n
        self.added = seen

    def close(self) -> None:
        base = self._base(self.mine)
        self.words[base:base + HEAD + COLUMNS] = memoryview(bytes(SLOT)).cast("q")
        self.words.release()
        self.map.close()
        os.close(self.fd)


def open_counts(workers: int) -> Local | Shared:
    """The table ``serve`` made for its workers, or ``Local`` with one worker or none made."""
    path = os.environ.get(ENV)
    if workers <= 1 or not path:
        return Local()
    try:
        return Shared(Path(path))
    except (OSError, RuntimeError) as exc:
        log.warning("endpoint picker: in-flight counts stay per worker (%s)", exc)
        return Local()
