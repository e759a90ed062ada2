"""Throw-away certificates for the mutual TLS tests, made with the ``openssl`` command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def available() -> bool:
    return shutil.which("openssl") is not None


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make(d: Path) -> Path:
    """In ``d``: ca.pem; server.pem/.key (for 127.0.0.1); client.pem/.key signed by ca;
    rogue.pem/.key signed by another CA. Returns ``d``."""
    for ca in ("ca", "otherca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                 "-subj", f"/CN={ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", cwd=d)
    for name, ca, ext in (("server", "ca", "subjectAltName=IP:127.0.0.1"),
                          ("client", "ca", "extendedKeyUsage=clientAuth"),
                          ("rogue", "otherca", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey",
                 f"{ca}.key", "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                 "-out", f"{name}.pem", cwd=d)
    return d
