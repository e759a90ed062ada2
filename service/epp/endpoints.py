"""Upstreams as the ``ip:port`` endpoints Envoy's ``override_host`` policy takes, and back.

An upstream URL's host may be a name (a Kubernetes pod's DNS name through a headless
Service, say); it is resolved (first address) off the event loop, again for each pools
generation and every ``TTL_S`` seconds, so a restarted pod's new address is picked up. An
upstream whose name does not resolve gets no endpoint and is left out of the picker's lists
(the error is logged on each resolution).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from urllib.parse import urlsplit

log = logging.getLogger("engine_advisor.epp")

TTL_S = 30.0


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

    def __init__(self, ttl_s: float = TTL_S):
        self.ttl_s = ttl_s
        self.resolved_at = 0.0
        self.generation: int | None = None
        self.of: dict[int, str] = {}          # id(upstream) -> endpoint
        self.by: dict[str, object] = {}       # endpoint -> upstream
        self.literal = False                  # every URL of the generation is an IP address
        self.complete = False                 # every upstream of the generation has one
        self.version = 0                      # one more for each rebuild of the maps

    def fresh(self, generation: int | None) -> bool:
        """Whether the maps are those of ``generation``, resolved less than ``ttl_s`` ago
        (literal addresses never need resolving again)."""
        return generation == self.generation and (
            self.literal or time.monotonic() - self.resolved_at < self.ttl_s)

    async def refresh(self, generation: int | None, upstreams: list) -> None:
        if self.fresh(generation):
            return
        now = time.monotonic()
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
        self.literal = all(_literal(url) for url in urls)
        self.complete = len(of) == len(upstreams)
        self.resolved_at = now
        self.version += 1

    def endpoint(self, upstream) -> str | None:
        return self.of.get(id(upstream))

    def listed(self, upstreams: list, generation: int | None) -> list:
        """``upstreams`` that have an endpoint, in order: the list itself when they are of
        the maps' ``generation`` and every upstream of it has one."""
        if self.complete and generation == self.generation:
            return upstreams
        of = self.of
        return [u for u in upstreams if id(u) in of]

    def upstream(self, endpoint: str):
        return self.by.get(endpoint)


def _literal(url: str) -> bool:
    try:
        ipaddress.ip_address(urlsplit(url).hostname or "")
    except ValueError:
        return False
    return True


def _resolve_all(urls: list[str]) -> list[str | OSError]:
    out: list[str | OSError] = []
    for url in urls:
        try:
            out.append(resolve(url))
        except OSError as exc:
            out.append(exc)
    return out
