"""Helpers of the calibration tests: real simulator processes on loopback, the CLI in a
subprocess, free ports. Every process started here is stopped by its fixture."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from proc import free_port

BIN = Path(sys.executable).parent / "engine-advisor"
REPO = Path(__file__).resolve().parents[2]



def cli(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, **kw)


def cli_in_process(*args: str) -> subprocess.CompletedProcess:
    """``engine-advisor ARGS`` in this process (saves the interpreter start-up of a
    subprocess; the engines it talks to are still real processes)."""
    import contextlib
    import io

    from engine_advisor.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:     # argparse errors
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


class SimProcs:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []

    def start(self, engine: str, *args: str, ready_timeout: float = 30.0) -> str:
        port = free_port()
        log_path = self.tmp / f"sim-{engine}-{port}.log"
        with log_path.open("wb") as log:
            p = subprocess.Popen([str(BIN), "sim", "--engine", engine, "--port", str(port),
                                  *args], stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        self.procs.append(p)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"simulator exited: {log_path.read_text()}")
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("simulator did not become healthy")

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
