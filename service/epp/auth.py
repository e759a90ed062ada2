"""Who may call the picker: the gateway only.

Two ways, either or both:

- a shared token (``epp_token``, from ``ENGINE_ADVISOR_EPP_TOKEN``) that Envoy sends in the
  stream's metadata (``grpc_service.initial_metadata``: ``authorization: Bearer <token>``),
  compared in constant time;
- mutual TLS (``epp_tls_cert`` / ``epp_tls_key`` / ``epp_tls_client_ca``): the port speaks
  TLS and completes no handshake without a client certificate signed by the client CA.

A ``Process`` stream that fails is refused with ``UNAUTHENTICATED`` before the picker reads
any of its messages, so it moves neither a breaker nor an in-flight count. The gRPC health
services answer without the token (they change nothing, and kubelet's gRPC probes cannot send
metadata); with mutual TLS nothing answers without a client certificate.
"""

from __future__ import annotations

import hmac
import logging
import time
from pathlib import Path

log = logging.getLogger("engine_advisor.epp")

HEADER = "authorization"
NEEDED = ("--epp-port: the picker's port needs authentication from the gateway: set "
          "ENGINE_ADVISOR_EPP_TOKEN (a shared token Envoy sends in grpc_service "
          "initial_metadata), or --epp-tls-cert, --epp-tls-key and --epp-tls-client-ca "
          "(mutual TLS); docs/gateway.md shows both")
WARN_EVERY_S = 10.0
MIN_TOKEN = 16
PLACEHOLDER = "REPLACE-ME"       # deploy/gateway/envoy.yaml's: never a token


def problem(settings) -> str | None:
    """Why these settings cannot serve the picker (the CLI's message), or None."""
    tls = (settings.epp_tls_cert, settings.epp_tls_key)
    if any(p is not None for p in tls) and not all(p is not None for p in tls):
        return "--epp-tls-cert and --epp-tls-key: give both, or neither"
    if settings.epp_tls_client_ca is not None and settings.epp_tls_cert is None:
        return "--epp-tls-client-ca: needs --epp-tls-cert and --epp-tls-key"
    for flag, path in (("--epp-tls-cert", settings.epp_tls_cert),
                       ("--epp-tls-key", settings.epp_tls_key),
                       ("--epp-tls-client-ca", settings.epp_tls_client_ca)):
        if path is not None and not Path(path).is_file():
            return f"{flag} {path}: not a readable file"
    if settings.epp_token is not None:
        token = settings.epp_token.get_secret_value().strip()
        if len(token) < MIN_TOKEN or PLACEHOLDER in token:
            return (f"ENGINE_ADVISOR_EPP_TOKEN: at least {MIN_TOKEN} characters of a secret "
                    "(e.g. `openssl rand -hex 32`), the value Envoy sends")
    if settings.epp_token is None and settings.epp_tls_client_ca is None:
        return NEEDED
    return None


def credentials(settings):
    """The port's ``grpc.ServerCredentials``; None for plaintext (token only)."""
    if settings.epp_tls_cert is None:
        return None
    import grpc

    def read(path: Path) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise RuntimeError(f"--epp-port: cannot read {path} ({exc.strerror})") from None

    ca = read(settings.epp_tls_client_ca) if settings.epp_tls_client_ca else None
    return grpc.ssl_server_credentials([(read(settings.epp_tls_key),
                                         read(settings.epp_tls_cert))],
                                       root_certificates=ca, require_client_auth=ca is not None)


class TokenCheck:
    """Checks a stream's metadata for the shared token (always passes without one)."""

    def __init__(self, token: str | None):
        self.expected = f"Bearer {token.strip()}".encode() if token else None
        self.refused = 0
        self._warned = 0.0

    def allows(self, metadata) -> bool:
        if self.expected is None:
            return True
        given = b""
        for key, value in metadata or ():
            if key == HEADER:
                given = value.encode() if isinstance(value, str) else value
                break
        if hmac.compare_digest(given, self.expected):
            return True
        self.refused += 1
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY_S:
            self._warned = now
            log.warning("endpoint picker: refused %d stream(s) without the gateway's token "
                        "so far", self.refused)
        return False
