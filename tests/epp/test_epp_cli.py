"""``serve --epp-port``: option and setting checks, and the service without the gRPC packages."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import pytest
import yaml

from engine_advisor.service import epp

POOLS = {"pools": {"vllm": [{"url": "http://127.0.0.1:1", "model": "m"}]},
         "workload": {"kv_bytes_per_token": 70272}}


def serve(*args: str) -> tuple[int, str]:
    from engine_advisor.cli.main import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["serve", *args])
    return code, err.getvalue()


@pytest.fixture
def pools(tmp_path):
    p = tmp_path / "pools.yaml"
    p.write_text(yaml.safe_dump(POOLS))
    return str(p)


def test_epp_port_needs_the_pools():
    code, err = serve("--epp-port", "9002")
    assert code == 2
    assert err.startswith("engine-advisor: error: --epp-port: needs the upstream pools")


def test_epp_port_range_and_clash_with_the_http_port(pools):
    code, err = serve("--upstreams", pools, "--epp-port", "70000")
    assert code == 2 and err.startswith("engine-advisor: error: --epp-port: ")
    code, err = serve("--upstreams", pools, "--epp-port", "8123", "--port", "8123")
    assert code == 2 and "--epp-port: 8123 is the HTTP port (--port) too" in err


def test_epp_port_without_the_grpc_packages(pools, monkeypatch):
    monkeypatch.setattr(epp, "available", lambda: False)
    code, err = serve("--upstreams", pools, "--epp-port", "9002")
    assert code == 2
    assert err.strip() == f"engine-advisor: error: {epp.MISSING}"
    assert "pip install 'engine-advisor[epp]'" in err


def test_the_service_imports_no_grpc_without_epp_port():
    code = ("import sys; from engine_advisor.service.main import create_app; "
            "from engine_advisor.service.settings import Settings; "
            "create_app(Settings(_env_file=None)); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'envoy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"


def test_setting_from_the_environment(monkeypatch):
    from engine_advisor.service.settings import Settings

    monkeypatch.setenv("ENGINE_ADVISOR_EPP_PORT", "9002")
    assert Settings().epp_port == 9002


def test_epp_port_needs_the_gateway_authentication(pools, monkeypatch, tmp_path):
    monkeypatch.delenv("ENGINE_ADVISOR_EPP_TOKEN", raising=False)
    code, err = serve("--upstreams", pools, "--epp-port", "9002")
    assert code == 2 and "needs authentication from the gateway" in err
    assert "ENGINE_ADVISOR_EPP_TOKEN" in err and "--epp-tls-client-ca" in err
    for weak in ("short", "Bearer REPLACE-ME:ENGINE_ADVISOR_EPP_TOKEN"):
        monkeypatch.setenv("ENGINE_ADVISOR_EPP_TOKEN", weak)
        code, err = serve("--upstreams", pools, "--epp-port", "9002")
        assert code == 2 and "ENGINE_ADVISOR_EPP_TOKEN: at least 16 characters" in err
    monkeypatch.delenv("ENGINE_ADVISOR_EPP_TOKEN")
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    code, err = serve("--upstreams", pools, "--epp-port", "9002", "--epp-tls-cert", str(cert))
    assert code == 2 and "--epp-tls-cert and --epp-tls-key: give both" in err
    code, err = serve("--upstreams", pools, "--epp-port", "9002", "--epp-tls-cert", str(cert),
                      "--epp-tls-key", str(tmp_path / "nope.key"),
                      "--epp-tls-client-ca", str(cert))
    assert code == 2 and "nope.key: not a readable file" in err
    # TLS without a client CA authenticates no one: the token is still needed
    code, err = serve("--upstreams", pools, "--epp-port", "9002", "--epp-tls-cert", str(cert),
                      "--epp-tls-key", str(cert))
    assert code == 2 and "needs authentication from the gateway" in err


def test_the_token_reaches_workers_from_the_environment_only(pools, monkeypatch):
    """serve passes its settings to uvicorn's workers as ENGINE_ADVISOR_* variables; the
    token stays the variable it came from (never its masked form)."""
    import os

    import uvicorn

    monkeypatch.setenv("ENGINE_ADVISOR_EPP_TOKEN", "a-gateway-token-of-some-length")
    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: seen.update(os.environ))
    saved = dict(os.environ)
    try:
        code, err = serve("--upstreams", pools, "--epp-port", "9002")
    finally:                        # serve wrote its settings into this process's environment
        os.environ.clear()
        os.environ.update(saved)
    assert code == 0, err
    assert seen["ENGINE_ADVISOR_EPP_TOKEN"] == "a-gateway-token-of-some-length"
    assert seen["ENGINE_ADVISOR_EPP_PORT"] == "9002"
