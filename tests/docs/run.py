"""Running a page's commands: ``engine-advisor`` in-process (its ``main``, output captured),
``curl`` for real against one ``engine-advisor serve`` started on a free loopback port the
first time a page needs it, and the parse-only check of illustrative commands."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine_advisor.calibration.ports import free_port

from .markers import ROOT

EXE = str(Path(sys.executable).with_name("engine-advisor"))
DOC_URL = re.compile(r"^(https?://)?(localhost|127\.0\.0\.1):8000(?=/|$)")
READY_TIMEOUT_S = 180.0       # a busy 2-core machine: the first start compiles nothing, but
CURL_TIMEOUT_S = 120          # loads numba's cache and the model under load


@dataclass
class Result:
    code: int
    out: str
    err: str


def run_cli(argv: list[str]) -> Result:
    """``engine-advisor ARGS`` in this process (``engine_advisor.cli.main.main``), stdout and stderr
    captured."""
    from engine_advisor.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv[1:])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return Result(code, out.getvalue(), err.getvalue())


def parses(argv: list[str]) -> str | None:
    """None when today's parser accepts the command line, else its error."""
    from engine_advisor.cli.main import build_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit as exc:
            if exc.code not in (0, None):
                return err.getvalue().strip().splitlines()[-1]
    return None


def unwrap_optional(argv: list[str]) -> list[str]:
    """A synopsis' ``[--host 127.0.0.1]`` as ``--host 127.0.0.1``."""
    return [t.strip("[]") for t in argv if t.strip("[]")]


class Server:
    """One ``engine-advisor serve`` on loopback, started on first use, stopped by ``close``."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._log = tempfile.NamedTemporaryFile(prefix="docs-serve-", suffix=".log",
                                                delete=False)

    def start(self) -> str:
        if self.proc is None:
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_ADVISOR_")}
            self.proc = subprocess.Popen(
                [EXE, "serve", "--port", str(port), "--log-level", "warning"], cwd=ROOT,
                stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
            deadline = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"engine-advisor serve exited with "
                                       f"{self.proc.returncode}:\n{self.log()}")
                try:
                    if httpx.get(self.url + "/readyz", timeout=2.0).status_code == 200:
                        return self.url
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            self.close()
            raise RuntimeError(f"engine-advisor serve not ready after {READY_TIMEOUT_S} s")
        return self.url

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def post(self, path: str, body: dict) -> httpx.Response:
        return httpx.post(self.start() + path, json=body, timeout=CURL_TIMEOUT_S)


def run_curl(argv: list[str], server: Server) -> Result:
    """The page's curl command with its ``localhost:8000`` pointed at the test's server."""
    base = server.start()
    args = [DOC_URL.sub(base, a) if DOC_URL.match(a) else a for a in argv]
    if args == argv:
        return Result(2, "", f"no localhost:8000 URL in {' '.join(argv)!r}")
    proc = subprocess.run(["curl", "--max-time", str(CURL_TIMEOUT_S), *args[1:]],
                          capture_output=True, text=True, timeout=CURL_TIMEOUT_S + 30, cwd=ROOT)
    code = proc.returncode
    if code == 0 and '"error": {' in proc.stdout.replace('"error":{', '"error": {'):
        code = 22     # an error envelope: the example does not work
    return Result(code, proc.stdout, proc.stderr)
