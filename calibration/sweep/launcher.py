"""Start an engine per (DCP size, memory fraction) combination, wait for ``/health``, stop it.

The command is a template split like a shell (``shlex``) and run without one; placeholders
``{model} {num_gpus} {tp} {dcp_size} {mem_fraction} {port}`` are filled per combination.
The engine runs in its own process group with its output in a log file of the run folder;
stopping sends SIGTERM to the group, then SIGKILL after a grace period.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.calibration.sweep.client import is_oom

PLACEHOLDERS = ("model", "num_gpus", "tp", "dcp_size", "mem_fraction", "port")
LOG_TAIL_BYTES = 4000


class LaunchTemplateError(CalibrationError, ValueError):
    pass



def format_command(template: str, **values: object) -> list[str]:
    """``template`` split into argv with placeholders filled; unknown ones are an error."""
    try:
        parts = shlex.split(template)
    except ValueError as exc:
        raise LaunchTemplateError(f"--launch: cannot split the command ({exc})") from None
    if not parts:
        raise LaunchTemplateError("--launch: empty command")
    out = []
    for part in parts:
        try:
            out.append(part.format(**values))
        except KeyError as exc:
            raise LaunchTemplateError(f"--launch: unknown placeholder {{{exc.args[0]}}}; known: "
                                      + ", ".join("{" + p + "}" for p in PLACEHOLDERS)) from None
        except (IndexError, ValueError) as exc:
            raise LaunchTemplateError(f"--launch: bad placeholder in {part!r} ({exc})") from None
    return out


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphaned engines
        except OSError:
            pass


class LaunchedEngine:
    """One engine process. ``start`` returns None when healthy, else why it failed."""

    def __init__(self, argv: list[str], port: int, log_path: Path, *, startup_timeout: float,
                 stop_grace: float):
        self.argv = argv
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None
        self._log_offset = 0

    def start(self) -> str | None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self._log_offset = log.tell()
        log.write(f"\n# engine-advisor: starting {shlex.join(self.argv)}\n".encode())
        log.flush()
        t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_parent)  # noqa: PLW1509
        except OSError as exc:
            return f"cannot start {self.argv[0]!r}: {exc.strerror or exc}"
        finally:
            log.close()
        deadline = t0 + self.startup_timeout
        with httpx.Client(base_url=self.url, timeout=5.0) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    return (f"engine exited with status {code} before becoming healthy "
                            f"(log {self.log_path})")
                try:
                    if client.get("/health").status_code == 200:
                        self.startup_s = time.monotonic() - t0
                        return None
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    return (f"engine not healthy after {self.startup_timeout:g} s "
                            f"(log {self.log_path})")
                time.sleep(0.1 if time.monotonic() - t0 < 5 else 1.0)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL after the grace period; the exit status."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                p.wait(self.stop_grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                p.wait()
        else:
            self._signal(signal.SIGKILL)   # children left behind by a dead leader
        return p.returncode

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self) -> str:
        """The end of this start's part of the log."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(self._log_offset, size - LOG_TAIL_BYTES))
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def log_text(self) -> str:
        """This start's part of the log, whole."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(self._log_offset)
                return f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def oom_in_log(self) -> bool:
        """An error line about running out of memory in this start's log (warnings that
        merely mention memory do not count)."""
        return any(is_oom(line) and "error" in line.lower()
                   for line in self.log_tail().splitlines())

    def server_args_lines(self) -> list[str]:
        """Log lines where the engine prints its arguments (vLLM: 'non-default args',
        SGLang: 'server_args=')."""
        return [line.strip()[:2000] for line in self.log_tail().splitlines()
                if "non-default args" in line or "server_args=" in line]
