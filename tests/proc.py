"""Shared test helper: ``engine-advisor`` subcommands as real processes on free loopback ports.

``Proc`` starts one (``sim`` or ``serve``), waits until an HTTP path answers 200 from that
process (``owns_port``), and stops it (SIGTERM, then SIGKILL) or kills it on purpose.
``start_all`` starts several at once and waits for them together (interpreter start-up
dominates; in parallel it is paid once), a proxy (``serve --upstreams``) only once the others
are ready (``start_all`` says why). Every process runs in its own session so a kill never
reaches the test runner.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from engine_advisor.calibration.ports import free_port

EXE = str(Path(sys.executable).with_name("engine-advisor"))


def wait_for(cond, timeout: float, step: float = 0.02) -> bool:
    """Poll ``cond()`` until it is true or ``timeout`` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()



def _session_socket_inodes(sid: int) -> set[str]:
    """The socket inodes open in the processes of session ``sid`` (Linux /proc)."""
    inodes: set[str] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if _session(int(entry)) != sid:
                continue
            for fd in os.listdir(f"/proc/{entry}/fd"):
                link = os.readlink(f"/proc/{entry}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except (OSError, ValueError, IndexError):
            continue
    return inodes


def _session(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[3])


def owns_port(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` or another of its session holds the socket listening on
    127.0.0.1:``port``; None where /proc cannot tell (not Linux).

    A port from ``free_port`` is free when it is picked, not when the child binds it seconds
    later: on a loaded machine running other test suites, another process took one in between,
    answered the readiness check in our process's place, and went away (connection refused on
    the first request; our process had exited on EADDRINUSE)."""
    try:
        table = Path("/proc/net/tcp").read_text().splitlines()[1:]
        sid = _session(pid)
    except OSError:
        return None
    local = f"0100007F:{port:04X}"
    listening = {f[9] for f in (line.split() for line in table)
                 if len(f) > 9 and f[1] == local and f[3] == "0A"}
    if not listening:
        return False
    return bool(listening & _session_socket_inodes(sid))


def port_taken(log: str) -> bool:
    """The child's log says its port was bound by another process before it could bind it."""
    return "address already in use" in log.lower()


def terminate(proc: subprocess.Popen | None, grace: float = 10.0) -> None:
    """SIGTERM a child process, then SIGKILL it if it has not exited after ``grace`` s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Proc:
    def __init__(self, command: str, *args: str, ready: str = "/health",
                 env: dict[str, str] | None = None):
        self.port = free_port()
        self.args = [EXE, command, "--port", str(self.port), *args]
        self.ready = ready
        base = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_ADVISOR_")}
        self.env = {**base, **(env or {})}
        self.proc: subprocess.Popen | None = None
        # run before each start: writes files that name other processes' ports
        self.prepare: Callable[[], None] | None = None
        self._log = tempfile.NamedTemporaryFile(prefix=f"{command}-", suffix=".log",
                                                delete=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def proxy(self) -> bool:
        """``serve`` with a pools file: it checks its upstreams' health from its first second
        (``args`` may have been wrapped, e.g. in ``sh -c``)."""
        return "serve" in self.args and "--upstreams" in self.args

    @property
    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def start(self) -> Proc:
        if self.prepare is not None:
            self.prepare()
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env,
                                     start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 60.0) -> Proc:
        """Until the process itself answers ``ready`` with 200. If another process took its
        port first (``owns_port``), it starts again on a fresh port, up to three times."""
        deadline = time.monotonic() + timeout
        moves = 0
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log
                if moves < 3 and port_taken(log):
                    moves += 1
                    self._move()
                    continue
                raise RuntimeError(f"{self.args[1]} exited with {self.proc.returncode}:\n{log}")
            try:
                if (httpx.get(self.url + self.ready, timeout=1.0).status_code == 200
                        and owns_port(self.proc.pid, self.port) is not False):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.args[1]} not ready after {timeout} s:\n{self.log}")

    def _move(self) -> None:
        """Start again on a fresh port (the ``--port`` argument, wherever it is)."""
        i = self.args.index("--port")
        self.port = free_port()
        self.args[i + 1] = str(self.port)
        self.start()

    def kill(self) -> None:
        """SIGKILL, as a crash would: no graceful shutdown, connections cut."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def metric(self, name: str) -> float:
        """The first sample of ``name`` on the process's /metrics page."""
        text = httpx.get(self.url + "/metrics", timeout=5.0).text
        for line in text.splitlines():
            if line.startswith((name + "{", name + " ")):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)


def start_all(*procs: Proc, timeout: float = 60.0) -> list[Proc]:
    """Start ``procs`` together and wait until each is ready; on failure stop them all.

    A proxy (``Proc.proxy``) is started once the others are ready. Its health checker looks at
    its upstreams as soon as it runs: started beside simulators that were still starting
    (connection refused, or /health 503 while they measure their time resolution), it marked
    them down and routed around them until its next check after they were up, and neither
    process's readiness showed it: a loaded machine sent short prompts to SGLang. Started
    after them, its first check finds them ready."""
    try:
        for group in ([p for p in procs if not p.proxy], [p for p in procs if p.proxy]):
            for p in group:
                p.start()
            for p in group:
                p.wait_ready(timeout)
    except BaseException:
        for p in procs:
            p.stop()
        raise
    return list(procs)
