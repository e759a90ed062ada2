"""``calibrate run``: sweep an engine over contexts x batch sizes x repeats, per (DCP, memory
fraction) combination, appending one dataset row per finished point.

A point sends ``batch_size`` streamed requests at once. Its dataset row holds what the cost model
predicts (``engine_advisor.calibration.sweep.pointtimes``): ``ttft_s`` = first request sent -> the
last first token (the batch's prefill), ``decode_step_s`` = the median inter-token gap while the
whole batch decodes (no prefill in the step), ``total_s`` = wall time of the whole batch; ``tpot_s``
(the engines' mean per-request TPOT) is kept for comparison. Per-request samples go to
``samples.jsonl``, each point's wall-clock start and end to ``manifest.json`` (``points``).

Every row names the served model's architecture (``engine_advisor.calibration.sweep.served_model``:
``--preset``, ``--hf-config`` or the engine's model id) and carries the engine's facts of its
combination (``engine_advisor.calibration.sweep.engine_facts``: KV capacity from ``/metrics``,
server info or the start-up log; ``weights`` from ``--load-format`` or what the engine states;
``max_running``, the running-request limit as launched, from the launch command, server info or the
log, empty for the default). Before a combination's first timed point an untimed warm-up runs
(``engine_advisor.calibration.sweep.warmup``; ``--no-warmup`` skips it). JIT compiles the engine
logs while serving (``--launch``: its own log; ``--url``: ``--engine-log``) become ``jit`` events
naming the point they hit.

Outcomes of a point:

- all (or some) requests succeeded: a row with times; failed requests count in ``errors``;
- out-of-memory (an OOM error message, or a launched engine that died with OOM in its log, or
  failed to start with one): a row without times and ``oom_retries`` set once the retries are
  spent, or a row with times and ``oom_retries`` > 0 when a retry succeeded. Either marks the
  memory fraction unsafe for the recommender;
- a launched engine that does not start: rows without times and ``errors`` set;
- other failures (unreachable, timeouts, HTTP errors): no row, an event in ``events.jsonl``; the
  point is retried by the next run. After ``--max-failed-points`` such points in a row the
  combination (or, with ``--url``, the sweep) is abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.calibration.ports import free_port
from engine_advisor.calibration.sweep.client import (
    PromptError,
    Sample,
    check_health,
    engine_info,
    request_body,
    send_streaming,
    text_prompt,
    token_prompt,
    warm_connections,
)
from engine_advisor.calibration.sweep.engine_facts import (
    EngineFacts,
    FactsError,
    LogTail,
    gather,
    jit_events,
    weights_of,
)
from engine_advisor.calibration.sweep.honesty import overhead_warnings, resolution_of
from engine_advisor.calibration.sweep.jitwatch import Interval, attribute, parse_utc
from engine_advisor.calibration.sweep.launcher import LaunchedEngine, format_command
from engine_advisor.calibration.sweep.pointtimes import RequestTimes, point_times
from engine_advisor.calibration.sweep.runstore import PointKey, RunStore, utc_now
from engine_advisor.calibration.sweep.served_model import (
    MODEL_CONFIG,
    ServedModel,
    ServedModelError,
    config_bytes,
    config_key,
    resolve_served_model,
)
from engine_advisor.calibration.sweep.warmup import long_prompt_tokens, warm_up
from engine_advisor.model.diskio import atomic_write
from engine_advisor.model.fit.dataset import Measurement

IDENTITY = ("engine", "model", "contexts", "output_tokens", "batch_sizes", "repeats",
            "dcp_sizes", "mem_fractions", "gpu", "num_gpus", "kv_bytes_per_token", "kv_shards",
            "prompt", "seed", "mode")
# parameters added later: part of a sweep's identity only when given (older folders resume)
OPTIONAL_IDENTITY = ("preset", "hf_config", "kv_cache_dtype", "load_format")


@dataclass
class SweepConfig:
    engine: str
    contexts: list[int]
    kv_bytes_per_token: int | None      # None: from the architecture
    out: str
    url: str | None = None
    launch: str | None = None
    model: str | None = None
    output_tokens: int = 256
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    repeats: int = 1
    dcp_sizes: list[int] = field(default_factory=lambda: [1])
    mem_fractions: list[float] = field(default_factory=lambda: [0.9])
    gpu: str = "B300"
    num_gpus: int = 8
    kv_shards: int | None = None        # None: from the architecture, else 1
    prompt: str = "token-ids"
    seed: int = 0
    request_timeout: float = 600.0
    retries: int = 2
    max_failed_points: int = 3
    port: int = 0
    startup_timeout: float = 1800.0
    stop_grace: float = 30.0
    progress: bool = True
    preset: str | None = None
    hf_config: dict[str, Any] | None = None     # a config.json's contents
    kv_cache_dtype: str | None = None           # bf16 | fp8; None: bf16 unless the bytes say fp8
    load_format: str | None = None              # dummy | real; None: what the engine states
    engine_log: str | None = None               # --url: the engine's log file
    warmup: bool = True

    @property
    def mode(self) -> str:
        return "launch" if self.launch else "url"

    def identity(self) -> dict[str, Any]:
        """The parameters that make two runs the same sweep (how the engine is reached and the
        timeouts may change between resumptions)."""
        d = {k: getattr(self, k) for k in IDENTITY}
        d["gpu"] = self.gpu.upper()
        if d["kv_shards"] is None:
            d["kv_shards"] = 1
        for k in OPTIONAL_IDENTITY:
            v = getattr(self, k)
            if v is not None:
                d[k] = config_key(v) if k == "hf_config" else v
        return d

    def served_upfront(self) -> ServedModel | None:
        """The served model when the flags name it (``--preset``, ``--hf-config``, or
        ``--model``); else None (resolved from ``/v1/models``). Raises
        ``ServedModelError`` naming the flag."""
        if self.preset is None and self.hf_config is None and not self.model:
            return None
        return resolve_served_model(
            preset_name=self.preset, hf_config=self.hf_config, model_id=self.model,
            kv_bytes_per_token=self.kv_bytes_per_token, kv_cache_dtype=self.kv_cache_dtype,
            kv_shards=self.kv_shards, num_gpus=self.num_gpus)

    def combos(self) -> list[tuple[int, float]]:
        return list(itertools.product(self.dcp_sizes, self.mem_fractions))

    def points(self, dcp: int, mem: float) -> list[PointKey]:
        return [PointKey(self.engine, dcp, mem, ctx, b, self.output_tokens, rep)
                for rep in range(self.repeats) for ctx in self.contexts for b in self.batch_sizes]

    def validate(self) -> None:
        if self.url and (len(self.dcp_sizes) > 1 or len(self.mem_fractions) > 1):
            raise ValueError("--url reaches one running engine: give one --dcp-size and one "
                             "--mem-fraction (lists need --launch)")
        if bad := [d for d in self.dcp_sizes if self.num_gpus % d]:
            raise ValueError(f"--dcp-size: {bad} do not divide --num-gpus {self.num_gpus}")
        if self.retries < 0:
            raise ValueError("--retries: must be >= 0")
        if self.engine_log and self.launch:
            raise ValueError("--engine-log: only with --url (--launch reads the log of the "
                             "engine it starts)")
        if self.load_format not in (None, "dummy", "real"):
            raise ValueError(f"--load-format: expected dummy or real, got {self.load_format!r}")
        if self.launch and not (self.model or self.preset or self.hf_config
                                or self.kv_bytes_per_token):
            raise ValueError("--kv-bytes-per-token: required with --launch unless --preset, "
                             "--hf-config or a --model naming a known architecture says it")
        self.served_upfront()
        if self.launch:
            format_command(self.launch, **self._placeholders(1, 0.9, 8000))
        from engine_advisor.model.hardware.gpus import builtin_gpu
        try:
            builtin_gpu(self.gpu)
        except KeyError:
            raise ValueError(f"--gpu: unknown GPU {self.gpu!r} (no bandwidth known to fit "
                             "its rows)") from None

    def _placeholders(self, dcp: int, mem: float, port: int) -> dict[str, object]:
        return {"model": self.model or self.preset or "MODEL", "num_gpus": self.num_gpus,
                "tp": self.num_gpus, "dcp_size": dcp, "mem_fraction": f"{mem:g}", "port": port}


class SweepAbort(CalibrationError, RuntimeError):
    """Stop the sweep (e.g. the engine cannot be reached); recorded before raising."""


class StopRequest:
    """Ctrl-C and SIGTERM for a sweep, never lost and never raised inside asyncio's machinery.

    Installed as the SIGINT/SIGTERM handler (so ``asyncio.run`` does not add its own), it
    records the request first. While an event loop runs a batch it cancels the batch's task
    (the point is not recorded); while a loop is being built or torn down around it (no task
    to cancel yet, or any more) it only records, and ``run_batch`` raises once the loop is
    closed: a ``KeyboardInterrupt`` raised inside the loop's constructor left a half-built
    loop behind (a traceback from its ``__del__``, a coroutine never awaited). While a point
    is being written (``writing``) the raise waits for the write to end. Anywhere else it
    raises ``KeyboardInterrupt`` at once. ``check`` raises after a batch or a write when a
    stop was asked for meanwhile.
    """

    def __init__(self) -> None:
        self.requested = False
        self._cancel = None          # cancels the running batch (set inside asyncio.run)
        self._writing = 0
        self._in_loop = 0            # inside asyncio.run: never raise there

    def handler(self, signum, frame) -> None:  # noqa: ARG002
        self.requested = True
        if self._cancel is not None:
            self._cancel()
        elif not (self._writing or self._in_loop):
            raise KeyboardInterrupt

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt

    def run_batch(self, coro_fn):
        """``asyncio.run`` of ``coro_fn()`` with this handler able to cancel it; every event
        loop of a sweep runs through here."""
        async def main():
            loop, task = asyncio.get_running_loop(), asyncio.current_task()
            self._cancel = lambda: loop.call_soon_threadsafe(task.cancel)
            try:
                if self.requested:   # asked while the loop was being built
                    raise asyncio.CancelledError
                return await coro_fn()
            finally:
                self._cancel = None
        self.check()
        self._in_loop += 1
        try:
            result = asyncio.run(main())
        except asyncio.CancelledError:
            if self.requested:
                raise KeyboardInterrupt from None
            raise
        finally:
            self._in_loop -= 1
        self.check()                 # asked during the batch but absorbed: the point is dropped
        return result

    @contextlib.contextmanager
    def writing(self):
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        self.check()


@dataclass
class Outcome:
    key: PointKey
    status: str                     # ok | partial | oom | failed-start | failed
    row: Measurement | None
    message: str = ""


@dataclass
class Target:
    url: str
    info: dict[str, Any]
    engine: LaunchedEngine | None = None
    log: LogTail | None = None          # the engine's log, read on as the sweep goes


class Sweep:
    def __init__(self, cfg: SweepConfig, transport: httpx.AsyncBaseTransport | None = None):
        self.cfg = cfg
        self.transport = transport      # tests: an httpx.MockTransport instead of the network
        self.store = RunStore(cfg.out, cfg.identity())
        self.outcomes: list[Outcome] = []
        self.bar = None
        self.model = cfg.model          # resolved from /v1/models when not given
        self.resolution: dict[str, Any] | None = None   # a simulator's, from /sim/info
        self.stop = StopRequest()
        self.served: ServedModel | None = None
        self.facts: dict[str, tuple[EngineFacts, str]] = {}    # label -> (facts, weights)
        self.intervals: list[Interval] = []     # warm-up and points of the current combination
        served = cfg.served_upfront()
        if served is not None:
            self._adopt_served(served)

    # ------------------------------------------------------------------ top level
    def run(self) -> list[Outcome]:
        cfg, store = self.cfg, self.store
        for msg in store.repaired:
            print(f"engine-advisor: repaired {msg}", file=sys.stderr)
            store.event("repair", msg)
        todo = [(combo, [k for k in cfg.points(*combo) if k not in store.done])
                for combo in cfg.combos()]
        total = sum(len(cfg.points(*c)) for c in cfg.combos())
        remaining = sum(len(keys) for _, keys in todo)
        run_rec = {"started": utc_now(), "status": "running", "points_total": total,
                   "points_already_done": total - remaining}
        store.manifest.setdefault("runs", []).append(run_rec)
        store.update_manifest()
        if remaining == 0:
            print(f"all {total} points of {cfg.out} are already recorded", file=sys.stderr)
        from tqdm import tqdm
        self.bar = tqdm(total=total, initial=total - remaining, unit="pt", file=sys.stderr,
                        disable=not cfg.progress, dynamic_ncols=True, desc="calibrate")
        status = "interrupted"
        try:
            for (dcp, mem), keys in todo:
                if keys:
                    self._combo(dcp, mem, keys)
            status = "finished"
        except SweepAbort as exc:
            status = f"aborted: {exc}"
            raise
        finally:
            self.bar.close()
            run_rec.update(finished=utc_now(), status=status,
                           points_recorded=sum(o.row is not None for o in self.outcomes),
                           points_failed=sum(o.row is None for o in self.outcomes))
            failing = sys.exc_info()[1]     # what ends the sweep, if anything
            try:
                store.update_manifest()
            except OSError:
                if failing is None:
                    raise
                # the sweep already failed (the disk, most likely): report that first error,
                # not this echo of it
        return self.outcomes

    def _combo(self, dcp: int, mem: float, keys: list[PointKey]) -> None:
        cfg = self.cfg
        label = f"dcp={dcp},mem={mem:g}"
        if cfg.url:
            target = self._connect(label)
            self._warmup(target, label)
            self._points(target, keys, label)
            return
        argv_port = cfg.port or free_port()
        argv = format_command(cfg.launch, **cfg._placeholders(dcp, mem, argv_port))
        log = Path(cfg.out) / "logs" / f"engine-dcp{dcp}-mem{mem:g}.log"
        engine = LaunchedEngine(argv, argv_port, log, startup_timeout=cfg.startup_timeout,
                                stop_grace=cfg.stop_grace)
        try:
            pending_oom, error = self._start(engine, label)
            if error is not None:
                facts = gather(cfg.engine, log=engine.log_text(), command=argv)
                try:
                    weights = weights_of(facts, cfg.load_format)
                except FactsError:
                    weights = cfg.load_format or "real"
                self.facts[label] = (facts, weights)
                self._failed_start(keys, error, pending_oom)
                return
            target = Target(engine.url, self._info(engine.url, label, engine), engine,
                            LogTail(engine.log_path, engine.log_size()))
            self._warmup(target, label)
            self._points(target, keys, label, pending_oom)
        finally:
            code = engine.stop()
            if code is not None:
                self.store.event("stop", f"{label}: engine stopped (exit status {code})",
                                 combo=label)

    # ------------------------------------------------------------------ engines
    def _start(self, engine: LaunchedEngine, label: str) -> tuple[int, str | None]:
        """Start (retrying up to --retries times); (OOM failures seen, final error or None)."""
        ooms = 0
        for attempt in range(self.cfg.retries + 1):
            self._status(f"{label}: starting engine")
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
            self._warn(msg)
            self.store.event("start-failed", msg, combo=label, oom=oom,
                             log_tail=engine.log_tail()[-1000:])
        return ooms, error

    def _failed_start(self, keys: list[PointKey], error: str, ooms: int) -> None:
        for key in keys:
            row = self._row(key, [], None, errors=1, oom_retries=ooms)
            self._record(key, row, [], "oom" if ooms else "failed-start", error)

    def _connect(self, label: str) -> Target:
        cfg = self.cfg
        url = cfg.url.rstrip("/")

        async def probe() -> str | None:
            async with self._client(url, 10.0) as client:
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
            async with self._client(url, 10.0) as client:
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
            self._warn(served.note)
            self.store.event("served-model", served.note, model=self.model)
        if served.config is not None:
            path = self.store.folder / MODEL_CONFIG
            atomic_write(path, config_bytes(served.config))
        self.store.update_manifest(served_model=served.to_json())

    def _engine_facts(self, url: str, label: str, info: dict[str, Any],
                      engine: LaunchedEngine | None) -> tuple[EngineFacts, str]:
        """KV capacity, memory split, chunk size ... of this combination, and its weights."""
        async def metrics() -> str | None:
            async with self._client(url, 10.0) as client:
                try:
                    r = await client.get("/metrics")
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
            self._warn(msg)
            self.store.event("fact-mismatch", msg, combo=label)
        self.facts[label] = (facts, weights)
        return facts, weights

    # ------------------------------------------------------------------ warm-up and JIT
    def _warmup(self, target: Target, label: str) -> None:
        self.intervals = []
        if not self.cfg.warmup:
            return
        facts = self.facts.get(label, (EngineFacts(), ""))[0]
        long_tokens = long_prompt_tokens(facts.chunk_tokens,
                                         target.info.get("max_model_len") or facts.max_model_len)
        self._status(f"{label}: warm-up")
        started = utc_now("milliseconds")

        async def go():
            limits = httpx.Limits(max_connections=max(self.cfg.batch_sizes) + 4)
            timeout = httpx.Timeout(self.cfg.request_timeout,
                                    connect=min(10.0, self.cfg.request_timeout))
            async with self._client(target.url, timeout, limits) as client:
                return await warm_up(client, self.model, self.cfg.batch_sizes,
                                     long_tokens=long_tokens, timeout=self.cfg.request_timeout,
                                     seed=str(self.cfg.seed))

        steps = self.stop.run_batch(go)
        finished = utc_now("milliseconds")
        failed = [s for s in steps if s.ok < s.requests]
        msg = (f"{label}: warm-up ({len(steps)} steps, not timed)"
               + (f"; {len(failed)} had failed requests: {failed[0].error}" if failed else ""))
        self.store.event("warmup", msg, combo=label, started=started, finished=finished,
                         steps=[s.to_json() for s in steps])
        self.intervals.append(Interval("warmup", parse_utc(started), parse_utc(finished)))
        self._jit(target, "warmup")

    def _jit(self, target: Target, fallback: str) -> None:
        """JIT compiles the engine logged since the last look, matched to the point they hit."""
        if target.log is None:
            return
        hits = attribute(jit_events(target.log.read()), self.intervals[-8:], fallback)
        for hit in hits:
            timed = hit.during not in (None, "warmup")
            msg = (f"JIT compile of {hit.kernel} at {hit.log_time} during "
                   f"{hit.during or 'no known point'}"
                   + (": that point's times include a kernel compile (extend the warm-up, or "
                      "delete its row and re-run to measure it again)" if timed else ""))
            if timed:
                self._warn(msg)
            self.store.event("jit", msg, **hit.to_json())

    # ------------------------------------------------------------------ points
    def _points(self, target: Target, keys: list[PointKey], label: str,
                pending_oom: int = 0) -> None:
        failed_in_a_row = 0
        for i, key in enumerate(keys):
            outcome = self._point(target, key, pending_oom)
            if outcome.row is not None:
                pending_oom = 0
            if outcome.status == "failed":
                failed_in_a_row += 1
                if failed_in_a_row >= self.cfg.max_failed_points:
                    msg = (f"{label}: {failed_in_a_row} points in a row failed "
                           f"(last: {outcome.message})")
                    self.store.event("abandon", msg, combo=label)
                    if self.cfg.url:
                        raise SweepAbort(msg)
                    self._warn(msg + "; moving on to the next combination")
                    return
            else:
                failed_in_a_row = 0
            if target.engine is not None and outcome.status == "oom" and not target.engine.alive():
                # the engine died of OOM and could not be brought back: the rest would fail too
                for rest in keys[i + 1:]:
                    row = self._row(rest, [], None, errors=1, oom_retries=1)
                    self._record(rest, row, [], "oom", "engine died of out-of-memory")
                return

    def _point(self, target: Target, key: PointKey, pending_oom: int) -> Outcome:
        cfg = self.cfg
        self._status(key.text())
        oom_retries, errors, all_samples = pending_oom, 0, []
        samples: list[Sample] = []
        wall = None
        message = ""
        started = utc_now("milliseconds")
        attempts = 0
        for attempt in range(cfg.retries + 1):
            attempts = attempt + 1
            try:
                samples, wall = self.stop.run_batch(
                    lambda attempt=attempt: self._batch(target.url, key, attempt))
            except PromptError as exc:
                raise SweepAbort(f"{key.text()}: {exc}") from None
            for s in samples:
                all_samples.append({"attempt": attempt, **s.to_json()})
            bad = [s for s in samples if not s.ok]
            errors += len(bad)
            died = target.engine is not None and not target.engine.alive()
            oom = any(s.oom for s in bad) or (died and target.engine.oom_in_log())
            if not bad:
                break
            message = bad[0].error or "request failed"
            if died:
                message = f"engine exited during the point ({message})"
            oom_retries += oom
            self.store.event("point-error", f"{key.text()} attempt {attempt + 1}: "
                             f"{len(bad)}/{len(samples)} requests failed: {message}",
                             key=key.text(), oom=oom, engine_died=died)
            if attempt == cfg.retries:
                break
            if died and not self._restart(target, key):
                break
        ok = [s for s in samples if s.ok]
        times = (started, utc_now("milliseconds"), attempts)
        self.intervals.append(Interval(key.text(), parse_utc(times[0]), parse_utc(times[1])))
        self._jit(target, key.text())
        if ok:
            row = self._row(key, ok, wall, errors=errors, oom_retries=oom_retries)
            status = "ok" if errors == 0 else "partial"
            return self._record(key, row, all_samples, status, message, times)
        if oom_retries:
            row = self._row(key, [], None, errors=errors, oom_retries=oom_retries)
            return self._record(key, row, all_samples, "oom", message, times)
        self._warn(f"{key.text()}: failed: {message}")
        out = Outcome(key, "failed", None, message)
        self.outcomes.append(out)
        return out

    def _restart(self, target: Target, key: PointKey) -> bool:
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

    async def _batch(self, url: str, key: PointKey, attempt: int) -> tuple[list[Sample], float]:
        cfg = self.cfg
        limits = httpx.Limits(max_connections=key.batch_size + 4,
                              max_keepalive_connections=key.batch_size + 4)
        timeout = httpx.Timeout(cfg.request_timeout, connect=min(10.0, cfg.request_timeout))
        async with self._client(url, timeout, limits) as client:
            prompts = []
            for i in range(key.batch_size):
                seed = f"{cfg.seed}/{key.text()}/{i}/{attempt}"
                if cfg.prompt == "text":
                    prompts.append(await text_prompt(client, self.model, key.context_tokens,
                                                     seed))
                else:
                    prompts.append(token_prompt(key.context_tokens, seed))
            bodies = [request_body(self.model, p, key.output_tokens) for p in prompts]
            await warm_connections(client, key.batch_size)
            t0 = time.perf_counter()
            samples = await asyncio.gather(*(
                send_streaming(client, b, output_tokens=key.output_tokens,
                               timeout=cfg.request_timeout, prompt_tokens=key.context_tokens,
                               index=i, t_batch=t0)
                for i, b in enumerate(bodies)))
            wall = time.perf_counter() - t0
        return list(samples), wall

    def _row(self, key: PointKey, ok: list[Sample], wall: float | None, *, errors: int,
             oom_retries: int) -> Measurement:
        cfg = self.cfg
        t = point_times([RequestTimes.of(s) for s in ok], batch_size=key.batch_size,
                        prompt_tokens=key.context_tokens, wall_s=wall)
        label = f"dcp={key.dcp_size},mem={key.mem_fraction:g}"
        version = ""
        info = self.store.manifest.get("engines", {}).get(label)
        if info:
            version = str(info.get("version") or "")
        facts, weights = self.facts.get(label, (EngineFacts(), cfg.load_format or "real"))
        served = self.served
        if served is None:        # a launch that failed before the engine named its model
            served = resolve_served_model(kv_bytes_per_token=cfg.kv_bytes_per_token,
                                          kv_cache_dtype=cfg.kv_cache_dtype,
                                          kv_shards=cfg.kv_shards)
        return Measurement(
            engine=key.engine, engine_version=version, gpu=cfg.gpu, num_gpus=cfg.num_gpus,
            dcp_size=key.dcp_size, mem_fraction=key.mem_fraction,
            context_tokens=key.context_tokens, output_tokens=key.output_tokens,
            batch_size=key.batch_size, kv_bytes_per_token=served.kv_bytes_per_token,
            kv_shards=served.kv_shards, ttft_s=t.ttft_s, tpot_s=t.tpot_s, total_s=t.total_s,
            oom_retries=oom_retries, errors=errors, source=key.source(), model=served.key,
            kv_cache_dtype=served.kv_cache_dtype, decode_step_s=t.decode_step_s,
            kv_capacity_tokens=facts.kv_capacity_tokens, weights=weights,
            max_running=facts.max_running_requested)

    def _record(self, key: PointKey, row: Measurement, samples: list[dict[str, Any]],
                status: str, message: str,
                times: tuple[str, str, int] | None = None) -> Outcome:
        with self.stop.writing():       # a Ctrl-C meanwhile stops the sweep after the write
            self.store.append_point(key, row, samples)
            if times is not None:
                self.store.record_point(key, *times)
            for note in overhead_warnings(row, self.resolution) if self.resolution else []:
                self._warn(f"{key.text()}: {note}")
                self.store.event("time-resolution", f"{key.text()}: {note}", key=key.text())
            if status != "ok":
                self.store.event(status, f"{key.text()}: {message or status}", key=key.text())
            self.bar.update(1)
            out = Outcome(key, status, row, message)
            self.outcomes.append(out)
        return out

    def _client(self, url: str, timeout: float | httpx.Timeout,
                limits: httpx.Limits | None = None) -> httpx.AsyncClient:
        kw: dict[str, Any] = {"base_url": url, "timeout": timeout}
        if limits is not None:
            kw["limits"] = limits
        if self.transport is not None:
            kw["transport"] = self.transport
        return httpx.AsyncClient(**kw)

    # ------------------------------------------------------------------ output
    def _status(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=True)

    def _warn(self, text: str) -> None:
        if self.bar is not None and not self.bar.disable:
            self.bar.write(f"warning: {text}", file=sys.stderr)
        else:
            print(f"warning: {text}", file=sys.stderr)


def summary_table(outcomes: list[Outcome]) -> str:
    head = (f"{'dcp':>4}{'mem':>6}{'context':>9}{'batch':>6}{'out':>6}{'rep':>4}"
            f"{'TTFT s':>9}{'step ms':>9}{'TPOT ms':>9}{'total s':>9}{'err':>5}{'oom':>5}"
            "  status")
    lines = [head, "-" * len(head)]
    for o in outcomes:
        k, r = o.key, o.row

        def fmt(v: float | None, scale: float = 1.0, w: int = 9, p: int = 3) -> str:
            return f"{v * scale:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"

        lines.append(
            f"{k.dcp_size:>4}{k.mem_fraction:>6.2f}{k.context_tokens:>9}{k.batch_size:>6}"
            f"{k.output_tokens:>6}{k.repeat:>4}"
            + (fmt(r.ttft_s) + fmt(r.decode_step_s, 1e3, p=2) + fmt(r.tpot_s, 1e3, p=2)
               + fmt(r.total_s) + f"{r.errors:>5}{r.oom_retries:>5}"
               if r else f"{'-':>9}" * 4 + f"{'-':>5}" * 2)
            + f"  {o.status}" + (f": {o.message}" if o.message and o.status != "ok" else ""))
    return "\n".join(lines)


def read_hf_config(path: str | None, flag: str = "--hf-config") -> dict[str, Any] | None:
    """The contents of a config.json named by a flag; ``ValueError`` naming the flag."""
    if path is None:
        return None
    import json
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{flag}: cannot read {path} ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{flag}: {path} is not a JSON object (a config.json)")
    return config
