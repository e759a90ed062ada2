"""Observation rows on a disk that refuses them: whole rows only, kept and retried, each on disk
exactly once (issue 43, section 3).

Deterministic, everywhere: ``ObservationFile`` with its system calls replaced by failing ones
(ENOSPC part way through a write, EROFS at open, EIO at fsync and at the cut-back), driven by
``ProxyState.flush_observations`` and ``ProxyState.stop`` as the service drives them.

Real processes: ``serve --data-dir`` with

- a file size limit (``RLIMIT_FSIZE`` set on the running process, then lifted: EFBIG, a full
  disk for that process alone; Linux, no privileges needed);
- a 64 KiB tmpfs filled up, then freed, and remounted read-only, then read-write again (needs
  root and mount rights: skipped with the reason otherwise).

Each time every answered request's row ends up in the file exactly once (each request asks for
a different ``max_tokens``, so each row is told apart by its output tokens), no line is torn,
and a restart reads them all back.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from proc import wait_for
from prometheus_client import CollectorRegistry, generate_latest
from rel_helpers import AUTH, serve_proc, start_all

from engine_advisor.model.fit.dataset import parse_csv
from engine_advisor.service.proxy import observations as observations_module
from engine_advisor.service.proxy import obsfile
from engine_advisor.service.proxy.observations import Observation, ObservationMetrics
from engine_advisor.service.proxy.obsfile import FILE, ObservationFile

pytestmark = pytest.mark.timeout(240)

LOGGER = "engine_advisor.proxy"


def row(i: int) -> Observation:
    """An observation told apart by its output tokens."""
    return Observation("vllm", "u0", "B300", 8, 1, 0.92, 70272, 1, 1000, i, 4, None, None, 0.5,
                       "kimi-k3")


def file_rows(path: Path) -> list[int]:
    """The output tokens of the rows in ``path``, which must hold whole lines only."""
    if not path.exists() or path.stat().st_size == 0:
        return []
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), f"torn last line: {raw[-80:]!r}"
    rows = parse_csv(raw.decode(), str(path))             # every line parses: none glued
    return [m.output_tokens for m in rows]


def oserror(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class Disk:
    """Faults for an ``ObservationFile``: ``room`` bytes more may be written (None: any),
    then writes fail with ENOSPC after a partial write; ``open_error``/``fsync_errors``/
    ``truncate_errors``: errors raised by those calls (the next N of them)."""

    def __init__(self, f: ObservationFile):
        self.f = f
        self.room: int | None = None
        self.open_error: int | None = None
        self.fsync_errors: list[int] = []
        self.truncate_errors: list[int] = []
        real_open, real_write = f._open, f._write
        real_fsync, real_truncate = f._fsync, f._truncate

        def _open(path, flags, *mode):
            if self.open_error is not None and flags & (os.O_WRONLY | os.O_RDWR):
                raise oserror(self.open_error)
            return real_open(path, flags, *mode)

        def _write(fd, data):
            if self.room is None:
                return real_write(fd, data)
            if self.room == 0:
                raise oserror(errno.ENOSPC)
            n = real_write(fd, data[: self.room])
            self.room -= n
            return n

        def _fsync(fd):
            if self.fsync_errors:
                raise oserror(self.fsync_errors.pop(0))
            return real_fsync(fd)

        def _truncate(fd, size):
            if self.truncate_errors:
                raise oserror(self.truncate_errors.pop(0))
            return real_truncate(fd, size)

        f._open, f._write, f._fsync, f._truncate = _open, _write, _fsync, _truncate

    def heal(self) -> None:
        self.room, self.open_error = None, None


@pytest.fixture
def state(tmp_path):
    """A ProxyState with a data directory, as ``_open_observations`` leaves it (no pools, no
    saver task: the tests call ``flush_observations`` for each second)."""
    from engine_advisor.service.proxy.state import ProxyState
    from engine_advisor.service.settings import Settings

    registry = CollectorRegistry()
    st = ProxyState(Settings(_env_file=None, data_dir=tmp_path), registry)
    st.observations.resize(10_000)
    st.obs_file = ObservationFile(tmp_path, 10_000)
    st.observations.unsaved = []
    st.disk = Disk(st.obs_file)
    st.registry = registry
    return st


def flush(st) -> None:
    asyncio.run(st.flush_observations())


def add(st, numbers) -> None:
    for i in numbers:
        st.observations.add(row(i))


def metric(st, name: str, **labels) -> float:
    for line in generate_latest(st.registry).decode().splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def messages(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == LOGGER)


# ------------------------------------------------------------------ deterministic faults
def test_a_full_disk_leaves_whole_rows_keeps_the_rest_and_writes_them_once(state, caplog,
                                                                         monkeypatch):
    monkeypatch.setattr(obsfile, "CHUNK_BYTES", 2000)      # a backlog goes in several pieces
    caplog.set_level(logging.INFO, LOGGER)
    path = state.obs_file.path
    add(state, range(1, 21))
    flush(state)
    assert file_rows(path) == list(range(1, 21))
    state.disk.room = 5000                                 # room for part of the next rows
    add(state, range(21, 121))
    flush(state)
    written = file_rows(path)                              # whole rows, cut at a chunk
    assert written[:20] == list(range(1, 21)) and 20 < len(written) < 120
    assert written == list(range(1, len(written) + 1))
    waiting = 120 - len(written)
    assert len(state.observations.kept) == waiting
    assert f"cannot write {waiting} row(s) to {path} (No space left on device)" \
        in messages(caplog)
    assert metric(state, "engine_advisor_proxy_observations_pending") == waiting
    assert metric(state, "engine_advisor_proxy_observation_write_errors_total",
                  errno="ENOSPC") == 1
    for second in range(3):                                # the disk stays full: retried
        add(state, [121 + second])
        flush(state)
    assert file_rows(path) == written
    assert len(state.observations.kept) == waiting + 3
    assert state.observations.unsaved                      # the flush keeps running
    state.disk.heal()
    flush(state)                                           # no new row: the kept ones
    assert file_rows(path) == list(range(1, 124))          # exactly once, in order
    assert not state.observations.unsaved and not state.observations.kept
    assert metric(state, "engine_advisor_proxy_observations_pending") == 0
    assert metric(state, "engine_advisor_proxy_observations_written_total") == 123
    assert f"{path} is written again" in messages(caplog)
    assert len(ObservationFile(path.parent, 10_000).read()) == 123


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.EIO])
def test_a_disk_that_refuses_the_file_keeps_the_rows_until_it_takes_them(state, caplog, code):
    caplog.set_level(logging.INFO, LOGGER)
    add(state, range(1, 6))
    flush(state)
    state.disk.open_error = code
    add(state, range(6, 56))
    flush(state)
    add(state, range(56, 61))
    flush(state)
    path = state.obs_file.path
    assert file_rows(path) == list(range(1, 6))
    assert f"cannot write 50 row(s) to {path} ({os.strerror(code)})" in messages(caplog)
    assert metric(state, "engine_advisor_proxy_observation_write_errors_total",
                  errno=errno.errorcode[code]) == 2
    state.disk.heal()
    flush(state)
    assert file_rows(path) == list(range(1, 61))


def test_a_failed_fsync_cuts_the_append_back_and_retries_it(state):
    add(state, range(1, 11))
    flush(state)
    state.disk.fsync_errors = [errno.EIO]
    add(state, range(11, 31))
    flush(state)
    path = state.obs_file.path
    assert file_rows(path) == list(range(1, 11))           # cut back: maybe not on the disk
    assert len(state.observations.kept) == 20
    flush(state)
    assert file_rows(path) == list(range(1, 31))


def test_a_failed_cut_back_is_done_before_the_next_append(state, caplog):
    """ENOSPC part way, and the truncate that would remove the fragment fails too (EIO): the
    next append cuts the file back to where the failed one began, so neither a torn line nor
    a row twice."""
    caplog.set_level(logging.INFO, LOGGER)
    add(state, range(1, 11))
    flush(state)
    path = state.obs_file.path
    size = path.stat().st_size
    state.disk.room = 500
    state.disk.truncate_errors = [errno.EIO]
    add(state, range(11, 41))
    flush(state)
    assert path.stat().st_size == size + 500               # the fragment is still there
    assert len(state.observations.kept) == 30
    state.disk.heal()
    flush(state)
    assert file_rows(path) == list(range(1, 41))
    assert "the rows of a failed write cut off (500 bytes dropped)" in messages(caplog)


def test_rows_past_the_bound_drop_the_oldest_and_are_counted(state, caplog, monkeypatch):
    monkeypatch.setattr(observations_module, "PENDING_ROWS", 10)
    caplog.set_level(logging.INFO, LOGGER)
    state.disk.open_error = errno.ENOSPC
    add(state, range(1, 8))
    flush(state)
    add(state, range(8, 26))
    flush(state)
    assert list(state.observations.kept) == [
        obsfile_line(i) for i in range(16, 26)]            # the newest 10
    assert state.observations.dropped == 15
    assert metric(state, "engine_advisor_proxy_observations_dropped_total") == 15
    assert metric(state, "engine_advisor_proxy_observations_pending") == 10
    assert "15 oldest dropped unwritten" in messages(caplog)
    state.disk.heal()
    flush(state)
    assert file_rows(state.obs_file.path) == list(range(16, 26))


def obsfile_line(i: int) -> str:
    from engine_advisor.model.fit.dataset import row_csv
    return row_csv(row(i).measurement())


def test_a_graceful_stop_writes_the_kept_rows(state):
    state.disk.open_error = errno.EROFS
    add(state, range(1, 31))
    flush(state)
    assert len(state.observations.kept) == 30
    add(state, range(31, 41))
    state.observations.take()          # a flush the stop cancelled before its thread ran
    add(state, range(41, 46))
    state.disk.heal()
    asyncio.run(state.stop())
    assert file_rows(state.obs_file.path) == list(range(1, 46))


def test_a_stop_during_a_failing_write_still_writes_its_rows(state):
    """The saver cancelled while its write runs in a thread (and fails): the stop's flush
    waits for it and writes its rows."""
    entered = []
    f = state.obs_file
    real_open = f._open

    def slow_failing_open(path, flags, *mode):
        if not entered:
            entered.append(1)
            time.sleep(0.5)
            raise oserror(errno.ENOSPC)
        return real_open(path, flags, *mode)

    f._open = slow_failing_open

    async def scenario():
        add(state, range(1, 21))
        saver = asyncio.ensure_future(state.flush_observations())
        while not entered:
            await asyncio.sleep(0.01)
        saver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await saver
        await state.stop()

    asyncio.run(scenario())
    assert file_rows(f.path) == list(range(1, 21))


def test_a_torn_tail_is_cut_off_at_start_with_the_bytes_dropped(tmp_path, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    f = ObservationFile(tmp_path, 100)
    f.append("".join(obsfile_line(i) for i in range(1, 4)))
    whole = f.path.stat().st_size
    with open(f.path, "ab") as out:
        out.write(b"vllm,,B300,8,1,0.92,500")              # a crash in the middle of a write
    rows = ObservationFile(tmp_path, 100).read()
    assert [m.output_tokens for m in rows] == [1, 2, 3]
    assert f.path.stat().st_size == whole
    assert f"{f.path}: a line torn by a crash cut off (23 bytes dropped)" in messages(caplog)
    f.append(obsfile_line(4))
    assert file_rows(f.path) == [1, 2, 3, 4]               # nothing glued


def test_a_torn_tail_left_by_another_writer_is_cut_before_appending(state, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    add(state, range(1, 4))
    flush(state)
    with open(state.obs_file.path, "ab") as out:
        out.write(b"sglang,,B300,8")
    add(state, range(4, 6))
    flush(state)
    assert file_rows(state.obs_file.path) == [1, 2, 3, 4, 5]
    assert "a torn line cut off the end (14 bytes dropped)" in messages(caplog)


def test_a_torn_tail_on_a_read_only_file_is_skipped_at_start(tmp_path, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    f = ObservationFile(tmp_path, 100)
    f.append(obsfile_line(1))
    with open(f.path, "ab") as out:
        out.write(b"vllm,,B3")
    g = ObservationFile(tmp_path, 100)
    Disk(g).open_error = errno.EROFS
    assert [m.output_tokens for m in g.read()] == [1]
    assert "a line torn by a crash (8 bytes) skipped; cannot cut it off (Read-only file " \
           "system)" in messages(caplog)


def test_plain_text_is_appended_whole_or_not_at_all(tmp_path):
    f = ObservationFile(tmp_path, 100)
    f.append(obsfile_line(1))
    disk = Disk(f)
    disk.room = 50
    with pytest.raises(OSError) as info:
        f.append("".join(obsfile_line(i) for i in range(2, 6)))
    assert info.value.errno == errno.ENOSPC
    assert file_rows(f.path) == [1]


def test_the_metrics_are_described_without_a_file():
    from engine_advisor.service.proxy.observations import Observations

    registry = CollectorRegistry()
    ObservationMetrics(Observations(10), registry)
    text = generate_latest(registry).decode()
    for name in ("engine_advisor_proxy_observations_pending",
                 "engine_advisor_proxy_observations_dropped_total",
                 "engine_advisor_proxy_observations_written_total"):
        assert f"\n{name} 0.0" in "\n" + text, text


# ------------------------------------------------------------------ real processes
CHAT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True}


@pytest.fixture(scope="module")
def sims():
    from rel_helpers import Proc
    procs = start_all(Proc("sim", "--engine", "vllm", "--time-scale", "0.001"),
                      Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale",
                           "0.001"))
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()


def start_serve(tmp: Path, sims, data: Path):
    srv = serve_proc(tmp, sims[:1], sims[1:])
    srv.args += ["--data-dir", str(data)]
    start_all(srv)
    return srv


def ask(srv, numbers) -> None:
    """One chat request per number, asking for that many tokens; each must be answered."""
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        for i in numbers:
            r = c.post("/v1/chat/completions", json={**CHAT, "max_tokens": i})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == i


def graceful_stop(srv) -> str:
    """SIGTERM, wait for the exit (generous: a busy machine), and the process's log."""
    os.killpg(srv.proc.pid, signal.SIGTERM)
    srv.proc.wait(timeout=60)
    log = srv.log
    srv.stop()
    return log


def check_restart(tmp: Path, sims, data: Path, expected: list[int]) -> None:
    """The file holds each expected row once, every line whole, and a restart reads them."""
    assert sorted(file_rows(data / FILE)) == expected
    again = start_serve(tmp, sims, data)
    try:
        r = httpx.get(again.url + "/v1/observations", headers=AUTH, timeout=30)
        assert r.status_code == 200
        assert sorted(m.output_tokens for m in parse_csv(r.text)) == expected
    finally:
        log = graceful_stop(again)
    assert "torn" not in log and "unreadable" not in log and "Traceback" not in log, log


LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="RLIMIT_FSIZE set on a running process (prlimit) is Linux's")


def limit_file_size(srv, data: Path, room: int) -> tuple[int, int]:
    """Let the service's files grow by ``room`` bytes more (its log too: past the larger of
    the two); the limits it had."""
    import resource

    soft, hard = resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE)
    log = Path(srv._log.name).stat().st_size        # empty at --log-level warning, so far
    try:
        resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE,
                         (max((data / FILE).stat().st_size, log) + room, hard))
    except OSError as exc:
        pytest.skip(f"cannot set the service's file size limit (prlimit: {exc})")
    return soft, hard


@LINUX
def test_a_file_size_limit_then_lifted_loses_no_row(sims, tmp_path):
    """A full disk for the service alone: writes past the limit fail (EFBIG) part way, as on a
    full disk; the limit lifted, then SIGTERM at once: the rows are written (by the next
    flush or by the stop's), each once."""
    import resource

    data = tmp_path / "data"
    srv = start_serve(tmp_path, sims, data)
    try:
        ask(srv, range(1, 41))
        assert wait_for(lambda: len(file_rows(data / FILE)) == 40, timeout=30, step=0.1)
        before = limit_file_size(srv, data, 3000)          # room for about 15 rows more
        ask(srv, range(41, 201))
        assert wait_for(lambda: "cannot write" in srv.log, timeout=30, step=0.1), srv.log
        assert f"to {data / FILE} (File too large)" in srv.log
        time.sleep(1.5)                                     # a retry or two, refused
        partial = file_rows(data / FILE)                    # whole lines only
        assert 40 <= len(partial) < 200 and len(partial) == len(set(partial))
        resource.prlimit(srv.proc.pid, resource.RLIMIT_FSIZE, before)
        log = graceful_stop(srv)
    finally:
        srv.stop()
    assert "Traceback" not in log, log
    check_restart(tmp_path, sims, data, list(range(1, 201)))
    print(f"\nfile size limit: {len(partial)} of 200 rows on disk while refused, 200 after "
          f"it was lifted and a SIGTERM")


@LINUX
def test_a_stop_while_the_disk_still_refuses_leaves_whole_rows(sims, tmp_path):
    """What cannot be written before the process stops is lost (the log said how many were
    waiting); what is on disk is whole, and a restart reads it."""
    data = tmp_path / "data"
    srv = start_serve(tmp_path, sims, data)
    try:
        ask(srv, range(1, 11))
        assert wait_for(lambda: len(file_rows(data / FILE)) == 10, timeout=30, step=0.1)
        limit_file_size(srv, data, 0)
        ask(srv, range(11, 41))
        assert wait_for(lambda: f"cannot write 30 row(s) to {data / FILE} (File too large)"
                        in srv.log, timeout=30, step=0.1), srv.log
        metrics = httpx.get(srv.url + "/metrics", timeout=30).text
        assert "\nengine_advisor_proxy_observations_pending 30.0" in metrics, metrics
        assert 'engine_advisor_proxy_observation_write_errors_total{errno="EFBIG"}' in metrics
        assert "\nengine_advisor_proxy_observations_written_total 10.0" in metrics
        log = graceful_stop(srv)
    finally:
        srv.stop()
    assert "Traceback" not in log, log
    assert f"30 row(s) could not be written to {data / FILE} before this stop" in log, log
    check_restart(tmp_path, sims, data, list(range(1, 11)))


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "64k"):
    """A small tmpfs at ``path``; the test is skipped when it cannot be mounted."""
    path.mkdir()
    if not sys.platform.startswith("linux") or shutil.which("mount") is None:
        pytest.skip("a tmpfs needs Linux's mount")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs (needs root and mount rights, "
                    f"CAP_SYS_ADMIN): {r.stderr.strip() or f'exit {r.returncode}'}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(d: Path) -> Path:
    """Fill the file system of ``d`` up (a file written until ENOSPC)."""
    filler = d / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def remount(d: Path, mode: str) -> None:
    """``mount -o remount,MODE``, retried while the service has the file open (EBUSY)."""
    deadline = time.monotonic() + 30
    while True:
        r = subprocess.run(["mount", "-o", f"remount,{mode}", str(d)], capture_output=True,
                           text=True, timeout=30)
        if r.returncode == 0:
            return
        assert time.monotonic() < deadline, r.stderr
        time.sleep(0.05)


@pytest.mark.slow
def test_a_full_disk_then_space_freed_loses_no_row(sims, tmp_path):
    with tmpfs(tmp_path / "disk") as data:
        srv = start_serve(tmp_path, sims, data)
        try:
            ask(srv, range(1, 21))
            assert wait_for(lambda: len(file_rows(data / FILE)) == 20, timeout=30, step=0.1)
            filler = fill(data)                       # the file's last page has some room
            ask(srv, range(21, 321))
            assert wait_for(lambda: "cannot write" in srv.log, timeout=30, step=0.1), srv.log
            assert f"to {data / FILE} (No space left on device)" in srv.log
            time.sleep(1.5)                                   # refused again
            partial = file_rows(data / FILE)                  # whole lines only
            assert 20 <= len(partial) < 320 and len(partial) == len(set(partial))
            filler.unlink()
            freed = time.monotonic()
            assert wait_for(lambda: len(file_rows(data / FILE)) == 320, timeout=30,
                            step=0.1), srv.log
            took = time.monotonic() - freed
            assert "is written again" in srv.log
            log = graceful_stop(srv)
        finally:
            srv.stop()
        assert "Traceback" not in log, log
        check_restart(tmp_path, sims, data, list(range(1, 321)))
    print(f"\nfull 64 KiB tmpfs: {len(partial)} of 320 rows on disk while full, all 320 "
          f"{took:.1f} s after the space was freed, and after a restart")


@pytest.mark.slow
def test_a_read_only_disk_then_writable_again_loses_no_row(sims, tmp_path):
    with tmpfs(tmp_path / "disk", size="1m") as data:
        srv = start_serve(tmp_path, sims, data)
        try:
            ask(srv, range(1, 11))
            assert wait_for(lambda: len(file_rows(data / FILE)) == 10, timeout=30, step=0.1)
            remount(data, "ro")
            ask(srv, range(11, 211))
            assert wait_for(lambda: "cannot write" in srv.log, timeout=30, step=0.1), srv.log
            assert f"to {data / FILE} (Read-only file system)" in srv.log
            time.sleep(1.5)
            assert file_rows(data / FILE) == list(range(1, 11))
            remount(data, "rw")
            freed = time.monotonic()
            assert wait_for(lambda: len(file_rows(data / FILE)) == 210, timeout=30,
                            step=0.1), srv.log
            took = time.monotonic() - freed
            log = graceful_stop(srv)
        finally:
            srv.stop()
        assert "Traceback" not in log, log
        check_restart(tmp_path, sims, data, list(range(1, 211)))
    print(f"\nread-only tmpfs: 10 of 210 rows on disk while read-only, all 210 {took:.1f} s "
          "after the remount read-write, and after a restart")
