"""The engine each combination of a sweep is measured on (``Target``), and ``Targets``, which
reaches it (``--url``) or starts it (``--launch``: retried, restarted when it dies during a point),
asks it what it is (version, models, a simulator's time resolution), settles which architecture it
serves (engine_advisor.calibration.sweep.served_model) and its facts (KV capacity, weights ...:
engine_advisor.calibration.sweep.engine_facts), records all that in the run folder, and keeps it
for the rows. Also the HTTP clients the sweep reaches engines with.

What runs on a target (warm-up, points): engine_advisor.calibration.sweep.driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from engine_advisor.calibration.sweep.client import check_health, engine_info
from engine_advisor.calibration.sweep.config import SweepConfig
from engine_advisor.calibration.sweep.engine_facts import EngineFacts
from engine_advisor.calibration.sweep.engine_jit import LogTail
from engine_advisor.calibration.sweep.engine_sources import FactsError, gather, weights_of
from engine_advisor.calibration.sweep.honesty import resolution_of
from engine_advisor.calibration.sweep.launcher import LaunchedEngine
from engine_advisor.calibration.sweep.runstore import PointKey, RunStore
from engine_advisor.calibration.sweep.served_model import (
    MODEL_CONFIG,
    ServedModel,
    ServedModelError,
    config_bytes,
    resolve_served_model,
)
from engine_advisor.calibration.sweep.stop import StopRequest, SweepAbort
from engine_advisor.model.diskio import atomic_write


@dataclass
class Target:
    """The engine a combination's points are sent to."""

    url: str
    info: dict[str, Any]
    engine: LaunchedEngine | None = None
    log: LogTail | None = None          # the engine's log, read on as the sweep goes


class Targets:
    """The sweep's engines: how they are reached, and what they said of themselves."""

    def __init__(self, cfg: SweepConfig, store: RunStore, stop: StopRequest,
                 transport: httpx.AsyncBaseTransport | None, *,
                 warn: Callable[[str], None], status: Callable[[str], None]):
        """``warn``, ``status``: what the sweep shows on stderr."""
        self.cfg, self.store, self.stop = cfg, store, stop
        self.transport = transport      # tests: an httpx.MockTransport instead of the network
        self.warn, self.status = warn, status
        self.model = cfg.model          # resolved from /v1/models when not given
        self.resolution: dict[str, Any] | None = None   # a simulator's, from /sim/info
        self.served: ServedModel | None = None
        self.facts: dict[str, tuple[EngineFacts, str]] = {}    # label -> (facts, weights)
        served = cfg.served_upfront()
        if served is not None:
            self._adopt_served(served)

    # ------------------------------------------------------------------ reaching engines
    def start(self, engine: LaunchedEngine, label: str) -> tuple[int, str | None]:
        """Start (retrying up to --retries times); (OOM failures seen, final error or None)."""
        ooms = 0
        for attempt in range(self.cfg.retries + 1):
            self.status(f"{label}: starting engine")
            error = engine.start()
            if error is None:
                self.store.event("start", f"{label}: engine healthy after "
                                 f"{engine.startup_s:.1f} s", combo=label, command=engine.argv,
                                 log=str(engine.log_path))
                return ooms, None
            oom = engine.oom_in_log()
            ooms += oom
            engine.stop()
            msg = f"{label}: start attempt {attempt + 1} failed: {error}" + \
                  (" (out of memory in the log)" if oom else "")
            self.warn(msg)
            self.store.event("start-failed", msg, combo=label, oom=oom,
                             log_tail=engine.log_tail()[-1000:])
        return ooms, error

    def launched(self, engine: LaunchedEngine, label: str) -> Target:
        """A started engine as the target of its combination (its info recorded)."""
        return Target(engine.url, self._info(engine.url, label, engine), engine,
                      LogTail(engine.log_path, engine.log_size()))

    def failed_start(self, engine: LaunchedEngine, label: str) -> None:
        """The facts of an engine that did not start, from its log and command."""
        cfg = self.cfg
        facts = gather(cfg.engine, log=engine.log_text(), command=engine.argv)
        try:
            weights = weights_of(facts, cfg.load_format)
        except FactsError:
            weights = cfg.load_format or "real"
        self.facts[label] = (facts, weights)

    def connect(self, label: str) -> Target:
        """``--url``: the running engine as the combination's target (its info recorded)."""
        cfg = self.cfg
        url = cfg.url.rstrip("/")

        async def probe() -> str | None:
            async with self.client(url, 10.0) as client:
                return await check_health(client)

        problem = self.stop.run_batch(probe)
        if problem:
            self.store.event("unreachable", problem, url=url)
            raise SweepAbort(f"{problem} (recorded in {self.store.folder}/events.jsonl)")
        log = None
        if cfg.engine_log:
            try:
                size = Path(cfg.engine_log).stat().st_size
            except OSError as exc:
                raise SweepAbort(f"--engine-log: cannot read {cfg.engine_log} "
                                 f"({exc.strerror})") from None
            log = LogTail(cfg.engine_log, size)
        return Target(url, self._info(url, label, None), log=log)

    def _info(self, url: str, label: str, engine: LaunchedEngine | None) -> dict[str, Any]:
        async def get() -> dict[str, Any]:
            async with self.client(url, 10.0) as client:
                info = await engine_info(client, self.cfg.engine)
                try:        # engine-advisor sim: its time resolution (None for an engine)
                    r = await client.get("/sim/info")
                    sim = r.json() if r.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    sim = None
                if resolution_of(sim):
                    info["sim_time_resolution"] = resolution_of(sim)
                return info

        info = self.stop.run_batch(get)
        self.resolution = info.get("sim_time_resolution")
        if not self.model:
            models = info.get("models") or []
            if not models:
                raise SweepAbort(f"{url}/v1/models lists no model; give --model")
            self.model = models[0]
        if self.served is None:
            self._resolve_served()
        old = self.store.manifest.get("engines", {}).get(label, {})
        if old.get("version") and info.get("version") and old["version"] != info["version"]:
            raise SweepAbort(f"engine version changed for {label}: {old['version']} recorded in "
                             f"{self.store.folder}, {info['version']} now; calibrate a new "
                             "version into a new --out folder")
        record = {**info, "url": url, "model": self.model}
        if engine is not None:
            record.update(command=engine.argv, log=str(engine.log_path),
                          startup_s=engine.startup_s, server_args_log=engine.server_args_lines())
        facts, weights = self._engine_facts(url, label, info, engine)
        record.update(facts=facts.to_json(), weights=weights)
        if self.cfg.engine_log:
            record["engine_log"] = self.cfg.engine_log
        self.store.record_engine(label, record)
        return info

    # ------------------------------------------------------------------ what is served
    def _resolve_served(self) -> None:
        cfg = self.cfg
        try:
            served = resolve_served_model(
                model_id=self.model, kv_bytes_per_token=cfg.kv_bytes_per_token,
                kv_cache_dtype=cfg.kv_cache_dtype, kv_shards=cfg.kv_shards,
                num_gpus=cfg.num_gpus)
        except ServedModelError as exc:
            raise SweepAbort(str(exc)) from None
        self._adopt_served(served)

    def _adopt_served(self, served: ServedModel) -> None:
        self.served = served
        if served.note:
            self.warn(served.note)
            self.store.event("served-model", served.note, model=self.model)
        if served.config is not None:
            path = self.store.folder / MODEL_CONFIG
            atomic_write(path, config_bytes(served.config))
        self.store.update_manifest(served_model=served.to_json())

    def _engine_facts(self, url: str, label: str, info: dict[str, Any],
                      engine: LaunchedEngine | None) -> tuple[EngineFacts, str]:
        """KV capacity, memory split, chunk size ... of this combination, and its weights."""
        async def metrics() -> str | None:
            async with self.client(url, 10.0) as client:
                try:
                    r = await client.get("/metrics")
                    if r.status_code == 200 and r.text.lstrip().startswith("["):
                        # TensorRT-LLM: JSON iteration stats, drained by each call (empty when
                        # idle); its Prometheus page, when served, keeps the KV blocks
                        p = await client.get("/prometheus/metrics")
                        if p.status_code == 200:
                            return p.text
                except httpx.HTTPError:
                    return None
                return r.text if r.status_code == 200 else None

        log = None
        if engine is not None:
            log = engine.log_text()
        elif self.cfg.engine_log:
            try:
                log = Path(self.cfg.engine_log).read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                raise SweepAbort(f"--engine-log: cannot read {self.cfg.engine_log} "
                                 f"({exc.strerror})") from None
        facts = gather(self.cfg.engine, metrics=self.stop.run_batch(metrics),
                       server_info=info.get("server_info"), log=log,
                       command=engine.argv if engine is not None else None)
        try:
            weights = weights_of(facts, self.cfg.load_format)
        except FactsError as exc:
            raise SweepAbort(str(exc)) from None
        mem = float(label.rsplit("mem=", 1)[1])
        if facts.mem_fraction is not None and abs(facts.mem_fraction - mem) > 1e-6:
            msg = (f"{label}: the engine reports memory fraction {facts.mem_fraction:g} (from "
                   f"{facts.sources.get('mem_fraction')}), the rows record --mem-fraction "
                   f"{mem:g}")
            self.warn(msg)
            self.store.event("fact-mismatch", msg, combo=label)
        self.facts[label] = (facts, weights)
        return facts, weights

    # ------------------------------------------------------------------ restarts and clients
    def restart(self, target: Target, key: PointKey) -> bool:
        """A launched engine that exited during ``key``, started again: whether it is up."""
        eng = target.engine
        eng.stop()
        self.store.event("restart", f"{key.text()}: restarting the engine after it exited",
                         key=key.text())
        error = eng.start()
        if error is not None:
            self.store.event("start-failed", f"restart failed: {error}", key=key.text(),
                             oom=eng.oom_in_log())
            return False
        return True

    def client(self, url: str, timeout: float | httpx.Timeout,
               limits: httpx.Limits | None = None) -> httpx.AsyncClient:
        """An HTTP client to an engine (through the tests' transport when one is given)."""
        kw: dict[str, Any] = {"base_url": url, "timeout": timeout}
        if limits is not None:
            kw["limits"] = limits
        if self.transport is not None:
            kw["transport"] = self.transport
        return httpx.AsyncClient(**kw)
