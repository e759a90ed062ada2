"""The proxy's long-lived state: the current pools, HTTP clients, health checks, reloads.

Reloads (POST /v1/upstreams/reload, SIGHUP, or the file's mtime changing) build a new ``Pools``
and swap it in; upstreams whose identity (engine, name, URL, key, connection limit) is
unchanged keep their state and connections. A file that cannot be used keeps the old pools;
``last_reload`` says why. Clients of dropped upstreams are closed once idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from engine_advisor.service.proxy.deadlines import Deadlines
from engine_advisor.service.proxy.decision import Decider
from engine_advisor.service.proxy.health_checker import HealthChecker
from engine_advisor.service.proxy.metrics import ProxyMetrics
from engine_advisor.service.proxy.observations import Observations
from engine_advisor.service.proxy.obsfile import FLUSH_S, ObservationFile
from engine_advisor.service.proxy.tokens import Tokenizer, load_tokenizer
from engine_advisor.service.proxy.upstreams import (
    Pools,
    PoolsConfig,
    Upstream,
    UpstreamsError,
    read,
)
from engine_advisor.service.settings import Settings

log = logging.getLogger("engine_advisor.proxy")

NO_POOLS = ("the proxy has no upstream pools: start `engine-advisor serve --upstreams FILE` "
            "or set ENGINE_ADVISOR_UPSTREAMS")
MIN_BODY_CAP = 32 << 20
BYTES_PER_CONTEXT_TOKEN = 16      # a token id in JSON, or a token of escaped text, at most


@dataclass
class ReloadRecord:
    ok: bool | None = None
    message: str | None = None
    at: float | None = None
    trigger: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def may_open(pool: list[Upstream], share: float) -> bool:
    """The panic threshold (engine_advisor.service.proxy.breaker): whether one more breaker of
    ``pool`` may open, leaving at most ``share`` of it open and at least one upstream closed."""
    n = len(pool)
    opened = sum(1 for u in pool if not u.breaker.closed)
    return opened + 1 <= min(int(n * share + 1e-9), n - 1)


class ProxyState:
    def __init__(self, settings: Settings, registry: CollectorRegistry):
        self.settings = settings
        self.path: Path | None = settings.upstreams
        self.pools: Pools | None = None
        self.tokenizer: Tokenizer | None = None
        self.counting = 0             # prompts being counted now (tokens.max_concurrent)
        self.metrics = ProxyMetrics(registry, lambda: self.pools)
        self.decider = Decider()
        self.deadlines = Deadlines()      # the timeouts of proxied requests
        self.observations = Observations(0)
        self.observations.export(registry)     # pending, dropped, written, write errors
        self.obs_file: ObservationFile | None = None    # with a data directory
        self.checker = HealthChecker(lambda: self.pools, on_round=self._export_health)
        self.last_reload = ReloadRecord()
        self.generation = 0
        self.seq = 0                  # pick counter: ties of in-flight go round-robin
        self._stat: tuple[int, int] | None = None
        self._tasks: list[asyncio.Task] = []
        self._retired: list[Upstream] = []     # dropped by a reload, closed once idle
        self._lock: asyncio.Lock | None = None
        self._sighup = False
        self._cap = self._body_cap_of(None)   # what body_cap() answers (set with pools)

    # ------------------------------------------------------------------ limits
    def body_cap(self) -> int:
        """The largest request body the proxy (and picker) take: ``proxy_max_body_bytes``,
        else what the pools' longest context needs; set when pools are installed."""
        return self._cap

    def _body_cap_of(self, pools: Pools | None) -> int:
        if self.settings.proxy_max_body_bytes is not None:
            return self.settings.proxy_max_body_bytes
        longest = pools.max_model_len() if pools is not None else None
        return max(MIN_BODY_CAP, (longest or 0) * BYTES_PER_CONTEXT_TOKEN)

    # ------------------------------------------------------------------ loading
    def _file_stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat() if self.path else None
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size) if st else None

    def _build(self, cfg: PoolsConfig, sha: str) -> Pools:
        old = {u.identity(): u for u in self.pools.upstreams} if self.pools else {}
        ups = []
        for engine, specs in cfg.pools.items():
            for spec in specs:
                kept = old.get(Upstream.identity_of(engine, spec))
                if kept is not None:          # same instance: keep state and connections
                    kept.configure(spec, cfg)
                    ups.append(kept)
                else:
                    ups.append(Upstream.create(engine, spec, cfg))
        self.generation += 1
        return Pools(cfg, ups, str(self.path), sha, self.generation)

    def _install(self, pools: Pools) -> None:
        previous = self.pools
        self.pools = pools
        self._cap = self._body_cap_of(pools)
        self.observations.resize(pools.config.observations)
        if self.obs_file is not None:
            self.obs_file.resize(pools.config.observations)
        names = [u.name for u in pools.upstreams]
        self.metrics.track(names)
        share = pools.config.breaker.max_open_percent / 100
        for model in pools.models:               # a pool: the upstreams a request may reach
            pool = pools.serving(model)
            for u in pool:
                u.breaker.may_open = functools.partial(may_open, pool, share)
        for u in pools.upstreams:
            u.breaker.on_change = lambda s, n=u.name: self.metrics.set_breaker(n, s)
            u.decided = self.metrics.decisions.cell(u.group_labels)
        self._export_health(pools)
        if previous is not None:
            kept = {id(u) for u in pools.upstreams}
            for u in previous.upstreams:
                if id(u) not in kept:
                    self._retired.append(u)
                    self._tasks.append(asyncio.ensure_future(self._close_when_idle(u)))

    async def _close_when_idle(self, up: Upstream) -> None:
        deadline = time.monotonic() + (self.pools.config.timeouts.total_s if self.pools else 60)
        while up.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        await up.aclose()
        self._retired.remove(up)

    def _read(self) -> tuple[PoolsConfig, str, Tokenizer | None]:
        cfg, sha = read(self.path)
        tok = None
        if cfg.tokens.tokenizer_file is not None:
            f = cfg.tokens.tokenizer_file
            if not f.is_absolute():
                f = self.path.parent / f
            tok = load_tokenizer(f)
        return cfg, sha, tok

    async def load(self, trigger: str) -> tuple[bool, str]:
        """(Re)load the pools file; on failure the current pools stay. (ok, message)."""
        if self.path is None:
            return False, "no pools file is configured (--upstreams / ENGINE_ADVISOR_UPSTREAMS)"
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            stat = self._file_stat()
            try:
                cfg, sha, tok = await asyncio.to_thread(self._read)
            except UpstreamsError as exc:
                self._stat = stat
                msg = str(exc) + ("; keeping the previous pools" if self.pools else "")
                self._record(False, msg, trigger)
                return False, msg
            self._stat = stat
            if self.pools is not None and sha == self.pools.sha256:
                msg = f"{self.path}: unchanged"
                self._record(True, msg, trigger)
                return True, msg
            self.tokenizer = tok
            pools = self._build(cfg, sha)
            self._install(pools)
            msg = (f"{self.path}: {len(pools.upstreams)} upstreams in "
                   f"{len(pools.engines)} pools (generation {pools.generation})")
            self._record(True, msg, trigger)
            return True, msg

    def _record(self, ok: bool, message: str, trigger: str) -> None:
        self.last_reload = ReloadRecord(ok, message, time.time(), trigger)
        self.metrics.reloads.labels("ok" if ok else "failed").inc()
        (log.info if ok else log.error)("upstreams %s (%s): %s", "loaded" if ok else
                                        "NOT loaded", trigger, message)

    # ------------------------------------------------------------------ background
    def _export_health(self, pools: Pools) -> None:
        for u in pools.upstreams:
            self.metrics.healthy.labels(u.name).set(1 if u.healthy else 0)
            self.metrics.set_breaker(u.name, u.breaker.state)

    async def _watch(self) -> None:
        every = self.settings.upstreams_watch_s
        while True:
            await asyncio.sleep(every)
            stat = self._file_stat()
            if stat is not None and stat != self._stat:
                await self.load("file changed")

    async def start(self) -> None:
        if self.path is None:
            return
        ok, msg = await self.load("startup")
        if not ok:
            raise UpstreamsError(msg)
        await self._open_observations()
        self.checker.start()
        if self.settings.upstreams_watch_s > 0:
            self._tasks.append(asyncio.ensure_future(self._watch()))
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError, AttributeError):
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGHUP, lambda: self._tasks.append(
                    asyncio.ensure_future(self.load("SIGHUP"))))
            self._sighup = True

    async def _open_observations(self) -> None:
        """With a data directory: the observations file read back, then appended to."""
        d = self.settings.data_dir
        if d is None:
            log.info("observations are kept in memory only (no data directory: "
                     "--data-dir / ENGINE_ADVISOR_DATA_DIR)")
            return
        f = self.obs_file = ObservationFile(d, self.pools.config.observations)
        rows = await asyncio.to_thread(f.read)
        self.observations.restore(rows)
        self.observations.unsaved = []
        log.info("observations: %d row(s) read back from %s", len(rows), f.path)
        self._tasks.append(asyncio.ensure_future(self._save_observations()))

    async def _save_observations(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            await self.flush_observations()

    async def flush_observations(self) -> None:
        """The rows observed since the last flush, appended to the file (in a thread)."""
        f = self.obs_file
        if f is None or not self.observations.unsaved:
            return
        text = self.observations.take()
        try:
            await asyncio.to_thread(f.append, text)
        except OSError as exc:     # a full or read-only disk: the rows stay in memory
            log.error("observations: cannot append to %s (%s)", f.path, exc.strerror)

    async def stop(self) -> None:
        if self._sighup:
            with contextlib.suppress(ValueError, RuntimeError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._sighup = False
        await self.checker.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        await self.flush_observations()         # a graceful stop loses none the disk takes
        if self.obs_file is not None and self.observations.pending:
            log.error("observations: %d row(s) could not be written to %s before this stop "
                      "and are lost", self.observations.pending, self.obs_file.path)
        for u in [*(self.pools.upstreams if self.pools else []), *self._retired]:
            await u.aclose()
        self._retired.clear()


@contextlib.asynccontextmanager
async def proxy_lifespan(state: ProxyState):
    await state.start()
    try:
        yield
    finally:
        await state.stop()
