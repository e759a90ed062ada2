"""Active health checks: GET each upstream's ``/health`` every ``interval_s``.

An upstream is marked down after ``failure_threshold`` consecutive failed checks (non-2xx,
connection error or no answer within ``timeout_s``) and up again after ``success_threshold``
consecutive good ones. The proxy also marks an upstream down at once when a connection to it
is refused; only the checker brings it back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import httpx

from engine_advisor.service.proxy.upstreams import Pools, Upstream

log = logging.getLogger("engine_advisor.proxy")


def mark_down(up: Upstream, why: str) -> None:
    if up.healthy:
        log.warning("upstream %s is down: %s", up.name, why)
    up.healthy = False
    up.health_ok = 0
    up.last_error = why


async def check_one(up: Upstream, pools: Pools) -> None:
    h = pools.config.health
    why = None
    try:
        r = await up.client.get(up.url + h.path, timeout=h.timeout_s)
        if not 200 <= r.status_code < 300:
            why = f"{h.path} answered {r.status_code}"
    except httpx.TimeoutException:
        why = f"{h.path} did not answer within {h.timeout_s} s"
    except httpx.HTTPError as exc:
        why = f"{h.path}: {type(exc).__name__}: {exc}"
    if why is None:
        up.health_fail = 0
        up.health_ok += 1
        if not up.healthy and up.health_ok >= h.success_threshold:
            log.warning("upstream %s is up again", up.name)
            up.healthy = True
            up.last_error = None
    else:
        up.health_ok = 0
        up.health_fail += 1
        if up.health_fail >= h.failure_threshold:
            mark_down(up, why)
        else:
            up.last_error = why


class HealthChecker:
    """The background task; reads the current pools on every round, so reloads apply."""

    def __init__(self, current: Callable[[], Pools | None],
                 on_round: Callable[[Pools], None] | None = None):
        self.current = current
        self.on_round = on_round
        self.task: asyncio.Task | None = None

    async def run_round(self) -> None:
        pools = self.current()
        if pools is None:
            return
        await asyncio.gather(*(check_one(u, pools) for u in pools.upstreams))
        if self.on_round is not None:
            self.on_round(pools)

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_round()
            except Exception:   # never let one bad round stop the checks
                log.exception("health check round failed")
            pools = self.current()
            await asyncio.sleep(pools.config.health.interval_s if pools else 1.0)

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
            self.task = None
