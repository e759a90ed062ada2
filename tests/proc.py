"""Shared test helper: ``engine-advisor`` subcommands as real processes on free loopback ports.

``Proc`` starts one (``sim`` or ``serve``), waits until an HTTP path answers 200, and stops it
(SIGTERM, then SIGKILL) or kills it on purpose. ``start_all`` starts several at once and waits
for them together (interpreter start-up dominates; in parallel it is paid once), a proxy
(``serve --upstreams``) only once the others are ready (``start_all`` says why). Every process
runs in its own session so a kill never reaches the test runner.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
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
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [EXE, command, "--port", str(self.port), *args]
        self.ready = ready
        base = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_ADVISOR_")}
        self.env = {**base, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.NamedTemporaryFile(prefix=f"{command}-", suffix=".log",
                                                delete=False)

    @property
    def proxy(self) -> bool:
        """``serve`` with a pools file: it checks its upstreams' health from its first second
        (``args`` may have been wrapped, e.g. in ``sh -c``)."""
        return "serve" in self.args and "--upstreams" in self.args

    @property
    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def start(self) -> Proc:
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env,
                                     start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 60.0) -> Proc:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.args[1]} exited with {self.proc.returncode}:\n"
                                   f"{self.log}")
            try:
                if httpx.get(self.url + self.ready, timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.args[1]} not ready after {timeout} s:\n{self.log}")

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
