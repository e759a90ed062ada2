"""``calibrate run``: sweep an engine over contexts x batch sizes x repeats, per (DCP, memory
fraction) combination, appending one dataset row per finished point.

``Sweep`` runs the combinations, the warm-up and the points, and records each point's outcome. Its
parts, each a module of engine_advisor.calibration.sweep: ``config`` (the settings), ``target`` (the
engine of a combination: reached or launched, what it states and serves), ``point`` (a point's
batch of streamed requests and its dataset row: the batch's prefill, decode step and total times),
``stop`` (``SweepAbort``, Ctrl-C and SIGTERM), ``outcome`` (what became of each point, and the
summary table). Per-request samples go to ``samples.jsonl``, each point's wall-clock start and end
to ``manifest.json`` (``points``).

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

import sys
from pathlib import Path
from typing import Any

import httpx

from engine_advisor.calibration.ports import free_port
from engine_advisor.calibration.sweep.client import PromptError, Sample
from engine_advisor.calibration.sweep.config import SweepConfig
from engine_advisor.calibration.sweep.engine_facts import EngineFacts
from engine_advisor.calibration.sweep.engine_jit import jit_events
from engine_advisor.calibration.sweep.honesty import overhead_warnings
from engine_advisor.calibration.sweep.jitwatch import Interval, attribute, parse_utc
from engine_advisor.calibration.sweep.launcher import LaunchedEngine, format_command
from engine_advisor.calibration.sweep.outcome import Outcome
from engine_advisor.calibration.sweep.point import point_row, send_batch
from engine_advisor.calibration.sweep.runstore import PointKey, RunStore, utc_now
from engine_advisor.calibration.sweep.stop import StopRequest, SweepAbort
from engine_advisor.calibration.sweep.target import Target, Targets
from engine_advisor.calibration.sweep.warmup import long_prompt_tokens, warm_up
from engine_advisor.model.fit.dataset import Measurement


class Sweep:
    """``calibrate run`` of ``cfg`` into its run folder, resuming what it holds: ``run()``."""

    def __init__(self, cfg: SweepConfig, transport: httpx.AsyncBaseTransport | None = None):
        """``transport``: tests' ``httpx.MockTransport`` instead of the network."""
        self.cfg = cfg
        self.store = RunStore(cfg.out, cfg.identity())
        self.outcomes: list[Outcome] = []
        self.bar = None
        self.stop = StopRequest()
        self.intervals: list[Interval] = []     # warm-up and points of the current combination
        self.targets = Targets(cfg, self.store, self.stop, transport, warn=self._warn,
                               status=self._status)

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
            target = self.targets.connect(label)
            self._warmup(target, label)
            self._points(target, keys, label)
            return
        argv_port = cfg.port or free_port()
        argv = format_command(cfg.launch, **cfg._placeholders(dcp, mem, argv_port))
        log = Path(cfg.out) / "logs" / f"engine-dcp{dcp}-mem{mem:g}.log"
        engine = LaunchedEngine(argv, argv_port, log, startup_timeout=cfg.startup_timeout,
                                stop_grace=cfg.stop_grace)
        try:
            pending_oom, error = self.targets.start(engine, label)
            if error is not None:
                self.targets.failed_start(engine, label)
                self._failed_start(keys, error, pending_oom)
                return
            target = self.targets.launched(engine, label)
            self._warmup(target, label)
            self._points(target, keys, label, pending_oom)
        finally:
            code = engine.stop()
            if code is not None:
                self.store.event("stop", f"{label}: engine stopped (exit status {code})",
                                 combo=label)

    # ------------------------------------------------------------------ no engine
    def _failed_start(self, keys: list[PointKey], error: str, ooms: int) -> None:
        """The combination's engine did not start: each point a row without times."""
        for key in keys:
            row = self._row(key, [], None, errors=1, oom_retries=ooms)
            self._record(key, row, [], "oom" if ooms else "failed-start", error)

    # ------------------------------------------------------------------ warm-up and JIT
    def _warmup(self, target: Target, label: str) -> None:
        self.intervals = []
        if not self.cfg.warmup:
            return
        facts = self.targets.facts.get(label, (EngineFacts(), ""))[0]
        long_tokens = long_prompt_tokens(facts.chunk_tokens,
                                         target.info.get("max_model_len") or facts.max_model_len)
        self._status(f"{label}: warm-up")
        started = utc_now("milliseconds")

        async def go():
            limits = httpx.Limits(max_connections=max(self.cfg.batch_sizes) + 4)
            timeout = httpx.Timeout(self.cfg.request_timeout,
                                    connect=min(10.0, self.cfg.request_timeout))
            async with self.targets.client(target.url, timeout, limits) as client:
                return await warm_up(client, self.targets.model, self.cfg.batch_sizes,
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
            if died and not self.targets.restart(target, key):
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

    async def _batch(self, url: str, key: PointKey, attempt: int) -> tuple[list[Sample], float]:
        cfg = self.cfg
        limits = httpx.Limits(max_connections=key.batch_size + 4,
                              max_keepalive_connections=key.batch_size + 4)
        timeout = httpx.Timeout(cfg.request_timeout, connect=min(10.0, cfg.request_timeout))
        async with self.targets.client(url, timeout, limits) as client:
            return await send_batch(client, cfg, self.targets.model, key, attempt)

    def _row(self, key: PointKey, ok: list[Sample], wall: float | None, *, errors: int,
             oom_retries: int) -> Measurement:
        label = f"dcp={key.dcp_size},mem={key.mem_fraction:g}"
        version = ""
        info = self.store.manifest.get("engines", {}).get(label)
        if info:
            version = str(info.get("version") or "")
        facts, weights = self.targets.facts.get(label,
                                                (EngineFacts(), self.cfg.load_format or "real"))
        return point_row(self.cfg, key, ok, wall, errors=errors, oom_retries=oom_retries,
                         version=version, facts=facts, weights=weights,
                         served=self.targets.served)

    def _record(self, key: PointKey, row: Measurement, samples: list[dict[str, Any]],
                status: str, message: str,
                times: tuple[str, str, int] | None = None) -> Outcome:
        with self.stop.writing():       # a Ctrl-C meanwhile stops the sweep after the write
            self.store.append_point(key, row, samples)
            if times is not None:
                self.store.record_point(key, *times)
            resolution = self.targets.resolution
            for note in overhead_warnings(row, resolution) if resolution else []:
                self._warn(f"{key.text()}: {note}")
                self.store.event("time-resolution", f"{key.text()}: {note}", key=key.text())
            if status != "ok":
                self.store.event(status, f"{key.text()}: {message or status}", key=key.text())
            self.bar.update(1)
            out = Outcome(key, status, row, message)
            self.outcomes.append(out)
        return out

    # ------------------------------------------------------------------ output
    def _status(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=True)

    def _warn(self, text: str) -> None:
        if self.bar is not None and not self.bar.disable:
            self.bar.write(f"warning: {text}", file=sys.stderr)
        else:
            print(f"warning: {text}", file=sys.stderr)
