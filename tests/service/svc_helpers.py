"""Helpers and fixtures of the service tests: in-process apps (TestClient), real servers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from model.artifact import save
from model.costmodel import CostModel
from model.dataset import read_csv
from model.default import REFERENCE_CSV
from service.main import create_app
from service.settings import Settings

SEED = {"context_tokens": 204_800, "output_tokens": 2048, "batch_size": 64,
        "kv_bytes_per_token": 70272, "gpu": "B300", "num_gpus": 8}
TOKEN = "s3cret-admin-token"
EXE = Path(sys.executable).parent / "engine-advisor"


def make_client(**settings) -> TestClient:
    return TestClient(create_app(Settings(_env_file=None, **settings)),
                      raise_server_exceptions=False)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with make_client() as c:
        yield c


def fit_artifact(path: Path, drop_last: int = 0) -> dict:
    """Fit the reference rows (optionally fewer, for a different version) and save."""
    rows = read_csv(REFERENCE_CSV)
    rows = rows[: len(rows) - drop_last] if drop_last else rows
    return save(CostModel.fit(rows, sources=["test"]), path)


@pytest.fixture(scope="session")
def artifact_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("models")
    fit_artifact(d / "good.joblib")
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args: list[str], env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_ADVISOR_")}
        self.log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server never blocks
        self.proc = subprocess.Popen(
            [str(EXE), "serve", "--port", str(self.port), "--log-level", "warning", *args],
            env={**full_env, **(env or {})}, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                out = self.log.read().decode(errors="replace")
                raise RuntimeError(f"server exited with {self.proc.returncode}: {out}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server not ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def start_server() -> Iterator:
    started: list[Server] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Server:
        s = Server(list(args), env)
        started.append(s)
        s.wait_ready()
        return s

    yield start
    for s in started:
        s.stop()


def assert_error(resp: httpx.Response, status: int, *, param: str | None = None,
                 contains: str | None = None) -> dict:
    """The envelope {"error": {"message", "type", "param", "code"}} with this status."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["code"] == status and err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param, err
    if contains is not None:
        assert contains.lower() in err["message"].lower(), err
    return err
