"""A full or read-only disk under `fit --out`, `calibrate run --out`, `calibrate import --out`
(and `openapi --out`, `fit --report`): one line `engine-advisor: error: PATH: ... (CAUSE)`,
exit 2, no traceback; the previous file intact and no temp file left.

Two kinds of tests. The injected ones (everywhere) make the OS refuse a write
(``OSError(ENOSPC)`` / ``OSError(EROFS)`` from fsync, mkstemp or write) through a stand-in
for the ``os`` or ``tempfile`` module of the one module under test. The tmpfs ones (where this
machine lets the tests mount: root, mount rights) run the real command as a process onto a
small tmpfs filled up or remounted read-only; elsewhere they skip, saying why."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import signal
import subprocess
import tempfile
import time
import types
from pathlib import Path

import pytest
from proc import EXE, Proc, wait_for

from engine_advisor.calibration.sweep import runstore
from engine_advisor.cli.main import main
from engine_advisor.model import diskio
from engine_advisor.model.diskio import atomic_write
from engine_advisor.model.errors import DiskError
from engine_advisor.model.fit import artifact
from engine_advisor.model.fit.artifact import arrays_path, load, save
from engine_advisor.model.fit.dataset import read_csv
from engine_advisor.model.fit.default import REFERENCE_CSV, default_model

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "calibration" / "data"
VLLM_BENCH = DATA / "vllm_bench_8k_c8.json"
IMPORT = ["calibrate", "import", "--format", "vllm-bench", str(VLLM_BENCH),
          "--kv-bytes-per-token", "70272"]
ENOSPC = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
EROFS = OSError(errno.EROFS, os.strerror(errno.EROFS))
CAUSES = {"full": (ENOSPC, "No space left on device"),
          "read-only": (EROFS, "Read-only file system")}


# ------------------------------------------------------------------ helpers
def run_cli(*args: str) -> subprocess.CompletedProcess:
    """``engine-advisor ARGS`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def run_exe(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``engine-advisor ARGS`` as a process."""
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, stdin=subprocess.DEVNULL)


def assert_one_error_line(r: subprocess.CompletedProcess, path: Path | str, cause: str) -> str:
    """Exit 2 and exactly one stderr line `engine-advisor: error: ...` naming ``path`` and
    ``cause``; no traceback. Returns that line."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("engine-advisor: error:")]
    assert len(errors) == 1, r.stderr
    assert not [line for line in r.stderr.splitlines()
                if line.startswith(("OSError", "  File "))], r.stderr
    line = errors[0]
    assert str(path) in line and cause in line, line
    return line


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden temp files included) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def stand_in(module: types.ModuleType, **replace) -> types.SimpleNamespace:
    """A stand-in for ``module`` (os, tempfile) with some functions replaced, to give one
    module under test through monkeypatch without touching the real module."""
    ns = types.SimpleNamespace(**{k: getattr(module, k) for k in dir(module)
                                  if not k.startswith("__")})
    for k, v in replace.items():
        setattr(ns, k, v)
    return ns


def refuse(exc: OSError, when=lambda *a, **kw: True, real=None):
    """A function that raises ``exc`` when ``when(*args, **kw)``, else calls ``real``."""
    def f(*args, **kw):
        if when(*args, **kw):
            raise OSError(exc.errno, exc.strerror)
        return real(*args, **kw)
    return f


# ------------------------------------------------------------------ injected: atomic_write
@pytest.mark.parametrize("state", ["full", "read-only"])
def test_atomic_write_names_the_path_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch,
                                                                    state):
    exc, cause = CAUSES[state]
    target = tmp_path / "out.yaml"
    target.write_bytes(b"old\n")
    if state == "full":      # the data went out, the disk refused it at fsync
        monkeypatch.setattr(diskio, "os", stand_in(os, fsync=refuse(exc)))
    else:                    # the temp file cannot be created
        monkeypatch.setattr(diskio, "tempfile",
                            stand_in(tempfile, mkstemp=refuse(exc)))
    with pytest.raises(DiskError) as info:
        atomic_write(target, b"new\n")
    assert str(info.value) == f"{target}: cannot write ({cause})"
    assert isinstance(info.value, OSError) and info.value.errno == exc.errno
    assert info.value.filename == str(target)
    assert snapshot(tmp_path) == {"out.yaml": b"old\n"}


def test_atomic_write_refuses_a_directory_or_a_fifo_in_the_way(tmp_path):
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "p")
    with pytest.raises(DiskError, match=r"/d: is a directory; not replacing it$"):
        atomic_write(tmp_path / "d", b"x")
    with pytest.raises(DiskError, match=r"/p: is not a regular file \(a FIFO\); not replacing"):
        atomic_write(tmp_path / "p", b"x")
    assert (tmp_path / "d").is_dir() and (tmp_path / "p").is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "p"]


def test_a_folder_that_cannot_be_created_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DiskError, match=r"/file/sub/m.json: cannot create its folder "
                                        r".*/file/sub \(Not a directory\)"):
        atomic_write(tmp_path / "file" / "sub" / "m.json", b"x")


# ------------------------------------------------------------------ injected: fit --out
@pytest.fixture
def previous(tmp_path) -> Path:
    """An artifact already at --out (the embedded model), to keep whole."""
    path = tmp_path / "out" / "m.json"
    save(default_model(), path)
    return path


@pytest.mark.parametrize("state", ["full", "read-only"])
def test_fit_out_on_a_bad_disk_is_one_line_and_keeps_the_previous_artifact(
        previous, monkeypatch, state):
    exc, cause = CAUSES[state]
    before = snapshot(previous.parent)
    old_version = load(previous)[1]["model_version"]
    if state == "full":
        monkeypatch.setattr(diskio, "os", stand_in(os, fsync=refuse(exc)))
    else:
        monkeypatch.setattr(diskio, "tempfile", stand_in(tempfile, mkstemp=refuse(exc)))
    r = run_cli("fit", str(REFERENCE_CSV), "--out", str(previous))
    line = assert_one_error_line(r, previous, cause)
    assert line == f"engine-advisor: error: {previous}: cannot write ({cause})"
    assert snapshot(previous.parent) == before
    assert load(previous)[1]["model_version"] == old_version


def test_fit_whose_arrays_cannot_be_written_puts_the_old_document_back(previous, monkeypatch):
    """The document went in, the arrays did not: the old document is put back byte for byte
    (the pair stays the old artifact), and nothing else is left."""
    before = snapshot(previous.parent)
    old_version = load(previous)[1]["model_version"]
    npz = arrays_path(previous)
    real_replace = os.replace
    monkeypatch.setattr(diskio, "os", stand_in(
        os, replace=refuse(ENOSPC, when=lambda src, dst: Path(dst) == npz, real=real_replace)))
    r = run_cli("fit", str(REFERENCE_CSV), "--out", str(previous))
    assert_one_error_line(r, npz, "No space left on device")
    assert snapshot(previous.parent) == before
    assert load(previous)[1]["model_version"] == old_version


def test_fit_with_no_previous_artifact_leaves_nothing_behind(tmp_path, monkeypatch):
    out = tmp_path / "m.json"
    npz = arrays_path(out)
    monkeypatch.setattr(diskio, "os", stand_in(
        os, replace=refuse(ENOSPC, when=lambda src, dst: Path(dst) == npz, real=os.replace)))
    r = run_cli("fit", str(REFERENCE_CSV), "--out", str(out))
    assert_one_error_line(r, npz, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_fit_out_onto_a_directory_or_a_fifo_says_what_it_is(tmp_path):
    (tmp_path / "d.json").mkdir()
    os.mkfifo(tmp_path / "p.json")
    r = run_cli("fit", str(REFERENCE_CSV), "--out", str(tmp_path / "d.json"))
    assert_one_error_line(r, tmp_path / "d.json", "is a directory")
    r = run_cli("fit", str(REFERENCE_CSV), "--out", str(tmp_path / "p.json"))
    assert_one_error_line(r, tmp_path / "p.json", "is not a regular file (a FIFO)")


@pytest.mark.parametrize("state", ["full", "read-only"])
def test_fit_report_and_openapi_out_on_a_bad_disk(tmp_path, monkeypatch, state):
    exc, cause = CAUSES[state]
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.md").write_text("old report\n")
    (tmp_path / "api.yaml").write_text("old: api\n")
    before = snapshot(tmp_path)
    report, real = tmp_path / "report", tempfile.mkstemp      # the artifact goes in, not these
    monkeypatch.setattr(diskio, "tempfile", stand_in(tempfile, mkstemp=refuse(
        exc, when=lambda prefix, dir: Path(dir) == report or prefix.startswith(".api."),
        real=real)))
    r = run_cli("fit", str(REFERENCE_CSV), "--out", str(tmp_path / "m.json"), "--report",
                str(tmp_path / "report"))
    assert_one_error_line(r, tmp_path / "report", cause)
    r = run_cli("openapi", "--out", str(tmp_path / "api.yaml"))
    assert_one_error_line(r, tmp_path / "api.yaml", cause)
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("m.")} == before


# ------------------------------------------------------------------ injected: calibrate import
@pytest.mark.parametrize("state", ["full", "read-only"])
@pytest.mark.parametrize("append", [False, True])
def test_calibrate_import_out_on_a_bad_disk(tmp_path, monkeypatch, state, append):
    exc, cause = CAUSES[state]
    out = tmp_path / "rows.csv"
    if append:
        assert run_cli(*IMPORT, "--out", str(out)).returncode == 0
    before = snapshot(tmp_path)
    if state == "full":
        monkeypatch.setattr(diskio, "os", stand_in(os, fsync=refuse(exc)))
    else:
        monkeypatch.setattr(diskio, "tempfile", stand_in(tempfile, mkstemp=refuse(exc)))
    r = run_cli(*IMPORT, "--out", str(out), *(["--append"] if append else []))
    assert_one_error_line(r, out, cause)
    assert snapshot(tmp_path) == before


def test_calibrate_import_out_onto_a_directory(tmp_path):
    (tmp_path / "rows.csv").mkdir()
    r = run_cli(*IMPORT, "--out", str(tmp_path / "rows.csv"), "--append")
    assert_one_error_line(r, tmp_path / "rows.csv", "is a directory")


# ------------------------------------------------------------------ injected: the run folder
def test_an_append_the_disk_refuses_half_way_is_cut_back(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"a": 1}\n')

    def half(fd, data):          # half the line goes out, then the disk is full
        if len(data) > 1:
            return os.write(fd, bytes(data[:len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(runstore, "os", stand_in(os, write=half))
    with pytest.raises(DiskError, match=f"^{path}: cannot write \\(No space left on device\\)$"):
        runstore._fsync_append(path, b'{"b": 2}\n')
    assert path.read_bytes() == b'{"a": 1}\n'


def test_a_run_folder_that_cannot_be_created_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(DiskError, match="/file/run: cannot create the run folder "
                                        r"\(Not a directory\)"):
        runstore.RunStore(tmp_path / "file" / "run", {"a": 1})


@pytest.fixture(scope="module")
def sim():
    """A simulator at time scale 1: each point takes a few hundred ms, so a disk can fill in
    the middle of a sweep."""
    p = Proc("sim", "--engine", "vllm", "--time-scale", "1", "--kv-bytes-per-token", "70272",
             "--max-model-len", "65536").start().wait_ready()
    yield p.url
    p.stop()


def sweep_args(url: str, out: Path) -> list[str]:
    return ["calibrate", "run", "--engine", "vllm", "--url", url, "--contexts", "1024,2048",
            "--batch-sizes", "1,2,3", "--output-tokens", "8", "--kv-bytes-per-token", "70272",
            "--no-progress", "--out", str(out)]


@pytest.mark.parametrize("state", ["full", "read-only"])
def test_calibrate_run_on_a_bad_disk_mid_sweep_names_the_file_and_resumes(
        tmp_path, monkeypatch, sim, state):
    """The disk goes bad after 2 points: one line naming the file and the cause and how many
    points are recorded; the dataset is whole; the same command afterwards finishes it."""
    exc, cause = CAUSES[state]
    out = tmp_path / "run"
    real_write = os.write

    def dataset_rows() -> int:
        with contextlib.suppress(OSError):
            return (out / "dataset.csv").read_bytes().count(b"\n") - 1
        return 0

    gone_bad = []

    def from_the_third_point(*args) -> bool:   # every write once 2 rows are in
        if not gone_bad and dataset_rows() >= 2:
            gone_bad.append(True)
        return bool(gone_bad)

    monkeypatch.setattr(runstore, "os", stand_in(
        os, write=refuse(exc, when=from_the_third_point, real=real_write),
        fsync=refuse(exc, when=lambda *a: bool(gone_bad), real=os.fsync)))
    monkeypatch.setattr(diskio, "os", stand_in(os, fsync=refuse(
        exc, when=lambda *a: bool(gone_bad), real=os.fsync)))
    r = run_cli(*sweep_args(sim, out))
    # the first failure is the one named, not the manifest's echo of it: the third point's
    # append, or an event logged before it (on a loaded machine a point can be slow or retried,
    # and the sweep says so in events.jsonl first)
    line = assert_one_error_line(r, out, cause)
    named = Path(line.removeprefix("engine-advisor: error: ").split(": ")[0])
    assert named.parent == out and named.name in ("samples.jsonl", "dataset.csv",
                                                  "events.jsonl"), line
    assert "2 points are recorded in" in line and "re-run the same command to resume" in line
    assert len(read_csv(out / "dataset.csv")) == 2
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    monkeypatch.undo()
    r = run_cli(*sweep_args(sim, out))
    assert r.returncode == 0, r.stderr
    rows = read_csv(out / "dataset.csv")
    assert len(rows) == 6 and len({r.source for r in rows}) == 6


def test_calibrate_run_into_a_folder_it_cannot_write(tmp_path, monkeypatch, sim):
    out = tmp_path / "run"
    monkeypatch.setattr(diskio, "tempfile", stand_in(tempfile, mkstemp=refuse(EROFS)))
    r = run_cli(*sweep_args(sim, out))
    assert_one_error_line(r, out / "manifest.json", "Read-only file system")


# ------------------------------------------------------------------ tmpfs: the real thing
class Tmpfs:
    """A tmpfs of ``size`` bytes mounted on a fresh folder; ``fill()`` takes all its free
    space, ``unfill()`` gives it back, ``remount("ro")`` / ``remount("rw")``."""

    def __init__(self, root: Path, size: str):
        self.path = root / "disk"
        self.path.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                            str(self.path)], capture_output=True, text=True)
        if r.returncode != 0:
            self.path.rmdir()
            pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}): the "
                        "injected tests above cover the same paths")

    def fill(self) -> None:
        with open(self.path / "fill", "ab", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)

    def unfill(self) -> None:
        (self.path / "fill").unlink(missing_ok=True)

    def remount(self, mode: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{mode}", str(self.path)], check=True)

    def close(self) -> None:
        subprocess.run(["umount", str(self.path)], check=False)
        self.path.rmdir()


@pytest.fixture
def disk(tmp_path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root and mount(8): the injected tests above cover "
                    "the same paths")
    made: list[Tmpfs] = []

    def make(size: str = "256k") -> Tmpfs:
        t = Tmpfs(tmp_path, size)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def spoil(d: Tmpfs, state: str) -> None:
    d.fill() if state == "full" else d.remount("ro")


def spoil_under(d: Tmpfs, state: str, proc: subprocess.Popen) -> None:
    """``spoil`` while ``proc`` (a sweep writing to the disk) is stopped, so that it cannot
    write on, or finish, between the check and the spoiling, however loaded the machine. A
    read-only remount is refused (EBUSY) while a file is open for writing: then the sweep runs
    on a moment and it is tried again."""
    for _ in range(200):
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            assert wait_for(lambda: _state(proc.pid) in ("T", "t", "Z", None), 5), \
                "the sweep did not stop"
            if state == "full":
                d.fill()
                return
            r = subprocess.run(["mount", "-o", "remount,ro", str(d.path)], capture_output=True,
                               text=True)
            if r.returncode == 0:
                return
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.005)
    raise AssertionError(f"{d.path}: cannot remount read-only ({r.stderr.strip()})")


def _state(pid: int) -> str | None:
    """A process's state letter (``T``: stopped), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def heal(d: Tmpfs, state: str) -> None:
    d.unfill() if state == "full" else d.remount("rw")


@pytest.mark.parametrize("state", ["full", "read-only"])
def test_tmpfs_fit_out(disk, state):
    d = disk("512k")
    out = d.path / "m.json"
    save(default_model(), out)
    before = snapshot(d.path)
    spoil(d, state)
    r = run_exe("fit", str(REFERENCE_CSV), "--out", str(out))
    assert_one_error_line(r, out, CAUSES[state][1])
    heal(d, state)
    assert snapshot(d.path) == before
    assert load(out)[0].version


@pytest.mark.parametrize("state", ["full", "read-only"])
def test_tmpfs_calibrate_import_out(disk, state):
    d = disk("64k")
    out = d.path / "rows.csv"
    assert run_exe(*IMPORT, "--out", str(out)).returncode == 0
    before = snapshot(d.path)
    spoil(d, state)
    r = run_exe(*IMPORT, "--out", str(out), "--append")
    assert_one_error_line(r, out, CAUSES[state][1])
    heal(d, state)
    assert snapshot(d.path) == before


@pytest.mark.parametrize("state", ["full", "read-only"])
def test_tmpfs_calibrate_run_out_from_the_start(disk, sim, state):
    d = disk("64k")
    (d.path / "run").mkdir()
    spoil(d, state)
    r = run_exe(*sweep_args(sim, d.path / "run"))
    assert_one_error_line(r, d.path / "run", CAUSES[state][1])
    assert not [p for p in (d.path / "run").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("state", ["full", "read-only"])
def test_tmpfs_calibrate_run_disk_goes_bad_mid_sweep(disk, sim, state):
    d = disk("256k")
    out = d.path / "run"
    p = subprocess.Popen([EXE, *sweep_args(sim, out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=REPO, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None:
            with contextlib.suppress(OSError):
                if (out / "dataset.csv").read_bytes().count(b"\n") >= 3:   # header + 2 rows
                    break
            time.sleep(0.01)
        assert p.poll() is None, "the sweep finished before the disk went bad"
        spoil_under(d, state, p)
        stdout, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    line = assert_one_error_line(r, out, CAUSES[state][1])
    assert "points are recorded in" in line
    data = (out / "dataset.csv").read_bytes()
    assert data.endswith(b"\n")
    recorded = read_csv(out / "dataset.csv")
    assert len(recorded) >= 2
    heal(d, state)
    again = run_exe(*sweep_args(sim, out))
    assert again.returncode == 0, again.stderr
    rows = read_csv(out / "dataset.csv")
    assert len(rows) == 6 and len({r.source for r in rows}) == 6
    assert [r.source for r in rows[:len(recorded)]] == [r.source for r in recorded]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("state", ["full", "read-only"])
def test_tmpfs_openapi_out(disk, state):
    d = disk("64k")
    out = d.path / "api.yaml"
    out.write_text("old: api\n")
    spoil(d, state)
    r = run_exe("openapi", "--out", str(out))
    assert_one_error_line(r, out, CAUSES[state][1])
    heal(d, state)
    assert snapshot(d.path) == {"api.yaml": b"old: api\n"}



GPU_RAW = REPO / "calibration" / "profiles" / "raw" / "h200-raw.json"


def test_calibrate_gpu_out_that_cannot_be_written(tmp_path):
    """`calibrate gpu --out` (stdlib-only command): a folder where its CSV goes is named."""
    out = tmp_path / "h200.json"
    out.with_suffix(".csv").mkdir()
    r = run_cli("calibrate", "gpu", "--from-raw", str(GPU_RAW), "--out", str(out))
    assert_one_error_line(r, out.with_suffix(".csv"), "is a directory")



@pytest.mark.parametrize("writer", ["dataset csv", "kernel profile rows", "model folder"])
def test_every_data_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch, writer):
    """The dataset CSV, the kernel profiles' rows and the served model's folder go through
    ``atomic_write`` too: a disk that refuses the write leaves the old file, byte for byte."""
    from engine_advisor.calibration.kernels.gpu_profile import write_rows
    from engine_advisor.calibration.sweep.modeldir import write_model_dir
    from engine_advisor.model.fit.dataset import write_csv

    target = tmp_path / {"dataset csv": "d.csv", "kernel profile rows": "k.csv",
                         "model folder": "config.json"}[writer]
    target.write_bytes(b"old\n")
    monkeypatch.setattr(diskio, "os", stand_in(os, fsync=refuse(ENOSPC)))
    with pytest.raises(DiskError, match="No space left on device"):
        if writer == "dataset csv":
            write_csv(target, read_csv(REFERENCE_CSV)[:3])
        elif writer == "kernel profile rows":
            write_rows(target, [{"gpu": "h200", "seconds": 1.0}], ["gpu", "seconds"])
        else:
            write_model_dir({"architectures": ["LlamaForCausalLM"], "vocab_size": 64},
                            tmp_path)
    assert snapshot(tmp_path) == {target.name: b"old\n"}

@pytest.mark.parametrize("state", ["full", "read-only"])
def test_tmpfs_calibrate_gpu_out(disk, state):
    d = disk("64k")
    out = d.path / "h200.json"
    spoil(d, state)
    r = run_exe("calibrate", "gpu", "--from-raw", str(GPU_RAW), "--out", str(out))
    line = assert_one_error_line(r, d.path, CAUSES[state][1])
    assert line.startswith("engine-advisor: error: --out: ")


def test_without_hard_links_a_failed_save_keeps_a_document_that_loads_the_old_model(
        previous, monkeypatch):
    """On a file system without hard links the old document cannot be kept aside: the new one
    stays, and its ``replaces`` loads the old model with the old arrays."""
    old_version = load(previous)[1]["model_version"]
    npz = arrays_path(previous)
    monkeypatch.setattr(artifact, "os", stand_in(
        os, link=refuse(OSError(errno.EPERM, "Operation not permitted"))))
    monkeypatch.setattr(diskio, "os", stand_in(
        os, replace=refuse(ENOSPC, when=lambda src, dst: Path(dst) == npz, real=os.replace)))
    r = run_cli("fit", str(REFERENCE_CSV), "--out", str(previous))
    assert_one_error_line(r, npz, "No space left on device")
    assert sorted(p.name for p in previous.parent.iterdir()) == ["m.json", "m.npz"]
    assert load(previous)[1]["model_version"] == old_version
