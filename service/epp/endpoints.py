"""Upstreams as the ``ip:port`` endpoints Envoy's ``override_host`` policy takes, and back.

An upstream URL's host may be a name; it is resolved (first address) once per pools
generation, off the event loop. An upstream whose name does not resolve gets no endpoint and
is left out of the picker's lists (the error is logged once per generation).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from urllib.parse import urlsplit

log = logging.getLogger("engine_advisor.epp")


def literal(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve(url: str) -> str:
    """``ip:port`` of a server root URL (``[v6]:port`` for IPv6); OSError when unresolvable."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        return literal(str(ipaddress.ip_address(host)), port)
    except ValueError:
        pass
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return literal(info[0][4][0], port)


class Endpoints:
    """Upstream <-> endpoint maps of the current pools, rebuilt when the generation changes."""

    def __init__(self):
        self.generation: int | None = None
        self.of: dict[int, str] = {}          # id(upstream) -> endpoint
        self.by: dict[str, object] = {}       # endpoint -> upstream

    async def refresh(self, generation: int | None, upstreams: list) -> None:
        if generation == self.generation:
            return
        urls = [u.url for u in upstreams]
        found = await asyncio.to_thread(_resolve_all, urls)
        of, by = {}, {}
        for u, ep in zip(upstreams, found, strict=True):
            if isinstance(ep, OSError):
                log.error("upstream %s: cannot resolve %s for the gateway (%s)", u.name, u.url,
                          ep)
                continue
            of[id(u)] = ep
            by.setdefault(ep, u)
        self.generation, self.of, self.by = generation, of, by

    def endpoint(self, upstream) -> str | None:
        return self.of.get(id(upstream))

    def upstream(self, endpoint: str):
        return self.by.get(endpoint)


def _resolve_all(urls: list[str]) -> list[str | OSError]:
    out: list[str | OSError] = []
    for url in urls:
        try:
            out.append(resolve(url))
        except OSError as exc:
            out.append(exc)
    return out
