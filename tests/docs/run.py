"""Running a page's examples as a user types them: a shell block's text by ``bash`` (``set -e``,
``pipefail``) and a Python block by ``.venv/bin/python``, from a copy of the repository root
(its entries linked, so what an example writes stays out of the checkout) whose ``.venv`` is
the test's own environment, with no virtual environment on ``PATH``: the README's install
(``python3 -m venv .venv && .venv/bin/pip install -e .``) puts nothing there, so a bare
``engine-advisor`` fails here as it would there. ``curl`` reaches one ``engine-advisor serve``
started on a free loopback port the first time a page needs it (a page's ``localhost:8000``
is that port). Also the parse-only check of illustrative commands."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from engine_advisor.calibration.ports import free_port

from .markers import PYTHON, ROOT, Block, kind

EXE = str(Path(sys.executable).with_name("engine-advisor"))
VENV = Path(sys.prefix)       # the test's environment: the examples' .venv
DOC_URL = re.compile(r"(?<![\w.-])(localhost|127\.0\.0\.1):8000(?![\d])")
READY_TIMEOUT_S = 180.0       # a busy 2-core machine: the first start compiles nothing, but
CURL_TIMEOUT_S = 120          # loads numba's cache and the model under load
EXAMPLE_TIMEOUT_S = 240
PRELUDE = ("set -eo pipefail\n"
           "trap 'echo \"docs test: exit $? from: $BASH_COMMAND\" >&2' ERR\n")


@dataclass
class Result:
    code: int
    out: str
    err: str


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


class Workspace:
    """The repository root as an example sees it: a temporary folder holding a link to each of
    the checkout's top-level entries and ``.venv`` linked to the test's environment."""

    def __init__(self):
        self.path: Path | None = None

    def root(self) -> Path:
        if self.path is None:
            self.path = Path(tempfile.mkdtemp(prefix="docs-examples-"))
            for entry in ROOT.iterdir():
                if entry.name != ".venv":
                    (self.path / entry.name).symlink_to(entry)
            (self.path / ".venv").symlink_to(VENV, target_is_directory=True)
        return self.path

    def curl_home(self) -> Path:
        """Where curl reads its defaults ($CURL_HOME/.curlrc): a bound on every call."""
        home = self.root().with_name(self.root().name + ".curl")
        if not home.exists():
            home.mkdir()
            (home / ".curlrc").write_text(f"max-time = {CURL_TIMEOUT_S}\n")
        return home

    def env(self) -> dict[str, str]:
        """The user's environment after the README's install: no ENGINE_ADVISOR_* settings and
        no folder on PATH holding an engine-advisor (an activated virtual environment)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_ADVISOR_")
               and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
        env["PATH"] = os.pathsep.join(
            d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "engine-advisor").exists())
        env["CURL_HOME"] = str(self.curl_home())
        return env

    def close(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path.with_name(self.path.name + ".curl"), ignore_errors=True)
            shutil.rmtree(self.path, ignore_errors=True)    # the links, not what they point to
            self.path = None


def run_example(block: Block, server: Server, ws: Workspace) -> Result:
    """The block as a user runs it from the repository root: a shell block's text by bash, a
    Python block's by ``.venv/bin/python``; its stdout, and exit status 22 when a curl answer
    is an error envelope (``curl -s`` exits 0 on an HTTP error)."""
    text = block.body
    if any(kind(c) == "curl" for c in block.commands()) and block.lang not in PYTHON:
        port = server.start().rsplit(":", 1)[1]
        text = DOC_URL.sub(f"127.0.0.1:{port}", text)
    if block.lang in PYTHON:
        argv, feed = [".venv/bin/python", "-"], {"input": text}
    else:
        argv, feed = ["bash", "-c", PRELUDE + text], {"stdin": subprocess.DEVNULL}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ws.root(),
                              env=ws.env(), timeout=EXAMPLE_TIMEOUT_S, **feed)
    except subprocess.TimeoutExpired as exc:
        return Result(124, "", f"timed out after {exc.timeout} s")
    code = proc.returncode
    if code == 0 and '"error": {' in proc.stdout.replace('"error":{', '"error": {'):
        code = 22     # an error envelope: the example does not work
    return Result(code, proc.stdout, proc.stderr)


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
