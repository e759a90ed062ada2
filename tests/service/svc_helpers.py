"""Helpers and fixtures of the service tests: in-process apps (TestClient), real servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import seedload
from fastapi.testclient import TestClient
from proc import Proc

from engine_advisor.model.fit.artifact import save
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.dataset import read_csv
from engine_advisor.model.fit.default import REFERENCE_CSV
from engine_advisor.service.main import create_app
from engine_advisor.service.settings import Settings

# the published benchmark under the reference data's stated assumptions (tests/seedload.py)
SEED = {"context_tokens": 204_800, **seedload.FIELDS}
TOKEN = "s3cret-admin-token"


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
    fit_artifact(d / "good.json")
    return d


def serve(*args: str, env: dict[str, str] | None = None) -> Proc:
    """``engine-advisor serve`` as a real process on a free loopback port (tests/proc.py)."""
    return Proc("serve", "--log-level", "warning", *args, ready="/readyz", env=env)


@pytest.fixture
def start_server() -> Iterator:
    started: list[Proc] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Proc:
        s = serve(*args, env=env)
        started.append(s)
        return s.start().wait_ready()

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
