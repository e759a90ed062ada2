"""``calibrate rebuild``: re-derive a run folder's dataset rows with the current semantics.

A row's times come from its point's requests in ``samples.jsonl`` (the last attempt's successful
ones, as ``calibrate run`` records them; ``engine_advisor.calibration.sweep.pointtimes``):
``ttft_s`` (the batch's prefill), ``decode_step_s``, ``tpot_s``. ``total_s`` was measured around the
batch and is kept (the samples only bound it from below). What the samples cannot say comes from the
manifest and the facts given:

- the served model: ``--preset`` / ``--hf-config``, else the manifest's ``served_model``, else
  the sweep's model name (its ``--model``, or the name the engine listed)
  (``engine_advisor.calibration.sweep.served_model``); the KV bytes per token the rows hold must
  agree with it;
- per (DCP, memory fraction) combination, the engine's facts
  (``engine_advisor.calibration.sweep.engine_facts``):
  the files given (``--engine-log``, ``--metrics``, ``--server-info``), the manifest's record of
  the engine (its server info, its launch command, facts a newer run stored) and a launched
  engine's log in ``logs/``; ``kv_capacity_tokens``, ``weights`` (``--load-format``, else what
  the engine states, else ``real``) and ``max_running`` (the running-request limit as launched:
  ``max_running_requested``; a row's own value when no source states one) go into every row of
  the combination;
- JIT compiles in the log, matched to the points' (or, in folders older than point times, the
  runs') wall-clock intervals, go into the manifest.

Rows without samples (out-of-memory rows, failed starts) keep their times. Nothing is written
until every folder given has been read; each file is then replaced atomically. ``manifest.json``
gains a ``rebuilt`` record, and its sweep parameters the flags given, so the same
``calibrate run`` (with those flags) resumes the folder.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.calibration.sweep.engine_facts import EngineFacts
from engine_advisor.calibration.sweep.engine_sources import FactsError, gather, weights_of
from engine_advisor.calibration.sweep.jitwatch import Interval, JitHit, attribute, parse_utc
from engine_advisor.calibration.sweep.pointtimes import RequestTimes, point_times
from engine_advisor.calibration.sweep.runstore import (
    DATASET,
    MANIFEST,
    SAMPLES,
    PointKey,
    key_of_row,
    sweep_id,
    utc_now,
)
from engine_advisor.calibration.sweep.served_model import (
    MODEL_CONFIG,
    ServedModel,
    ServedModelError,
    config_bytes,
    config_key,
    resolve_served_model,
)
from engine_advisor.model.diskio import atomic_write
from engine_advisor.model.fit.dataset import (
    DatasetError,
    Measurement,
    header_csv,
    read_csv,
    row_csv,
)


class RebuildError(CalibrationError, ValueError):
    """A run folder that cannot be rebuilt; the message names the folder and the problem."""


@dataclass
class RebuildInputs:
    """What the command line adds (None: not given)."""

    preset: str | None = None
    hf_config: dict[str, Any] | None = None
    kv_cache_dtype: str | None = None
    load_format: str | None = None
    engine_log: str | None = None       # the engine log's text
    metrics: str | None = None          # a /metrics answer's text
    server_info: dict[str, Any] | None = None


@dataclass
class Rebuilt:
    """A folder's new contents, not yet written."""

    folder: Path
    rows: list[Measurement]
    manifest: dict[str, Any]
    served: ServedModel
    from_samples: int = 0
    with_decode_step: int = 0
    kept: int = 0
    jit: list[JitHit] = field(default_factory=list)
    facts: dict[str, tuple[EngineFacts, str]] = field(default_factory=dict)


def _load_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RebuildError(f"{folder}: no {MANIFEST}: not a run folder of `calibrate "
                           "run`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RebuildError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("parameters"), dict):
        raise RebuildError(f"{path}: no sweep parameters in the manifest")
    return manifest


def _samples(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Per point key, its last attempt's successful requests."""
    path = folder / SAMPLES
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    if not path.exists():
        return {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RebuildError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
        if isinstance(rec, dict) and isinstance(rec.get("key"), str):
            by_key[rec["key"]].append(rec)
    out = {}
    for key, recs in by_key.items():
        last = max(int(r.get("attempt", 0)) for r in recs)
        out[key] = [r for r in recs if int(r.get("attempt", 0)) == last and r.get("ok")]
    return out


def _served(folder: Path, manifest: dict[str, Any], inputs: RebuildInputs,
            rows: list[Measurement]) -> ServedModel:
    params = manifest["parameters"]
    # the served name: the sweep's --model, else what the engine listed (recorded per combo)
    model_id = params.get("model") or next(
        (e.get("model") for e in (manifest.get("engines") or {}).values() if e.get("model")),
        None)
    kv = params.get("kv_bytes_per_token") or (rows[0].kv_bytes_per_token if rows else None)
    preset, hf_config = inputs.preset, inputs.hf_config
    if preset is None and hf_config is None:
        recorded = (manifest.get("served_model") or {}).get("model") or ""
        if recorded.startswith("hf:") and (folder / MODEL_CONFIG).is_file():
            try:
                hf_config = json.loads((folder / MODEL_CONFIG).read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise RebuildError(f"{folder / MODEL_CONFIG}: unreadable ({exc})") from None
        elif recorded and (manifest.get("served_model") or {}).get("source") == "preset":
            preset = recorded
    try:
        return resolve_served_model(
            preset_name=preset, hf_config=hf_config, model_id=model_id,
            kv_bytes_per_token=kv,
            kv_cache_dtype=inputs.kv_cache_dtype or params.get("kv_cache_dtype"),
            num_gpus=int(params.get("num_gpus") or 1))
    except ServedModelError as exc:
        raise RebuildError(f"{folder}: {exc}") from None


def _combo_facts(folder: Path, engine: str, label: str, record: dict[str, Any],
                 inputs: RebuildInputs, load_format: str | None) -> tuple[EngineFacts, str]:
    log = inputs.engine_log
    if log is None:
        dcp, mem = label.split(",")
        own = folder / "logs" / f"engine-{dcp.replace('=', '')}-{mem.replace('=', '')}.log"
        if own.is_file():
            log = own.read_text(encoding="utf-8", errors="replace")
    facts = gather(engine, metrics=inputs.metrics,
                   server_info=inputs.server_info or record.get("server_info"), log=log,
                   command=record.get("command"))
    facts = facts.merged(EngineFacts.from_json(record.get("facts")))
    try:
        weights = weights_of(facts, load_format)
    except FactsError as exc:
        raise RebuildError(f"{folder} {label}: {exc}") from None
    return facts, weights


def _intervals(manifest: dict[str, Any]) -> list[Interval]:
    """The points' wall-clock intervals, else the runs'."""
    out = []
    for key, t in sorted((manifest.get("points") or {}).items()):
        a, b = parse_utc(t.get("started")), parse_utc(t.get("finished"))
        if a and b:
            out.append(Interval(key, a, b))
    if out:
        return out
    for run in manifest.get("runs") or []:
        a, b = parse_utc(run.get("started")), parse_utc(run.get("finished"))
        if a and b:
            out.append(Interval(f"run started {run['started']}", a, b))
    return out


def plan(folder: str | Path, inputs: RebuildInputs) -> Rebuilt:
    """Read one run folder and derive its new rows and manifest (nothing is written)."""
    folder = Path(folder)
    manifest = _load_manifest(folder)
    params = manifest["parameters"]
    engine = params.get("engine")
    try:
        rows = read_csv(folder / DATASET)
    except DatasetError as exc:
        raise RebuildError(str(exc)) from None
    samples = _samples(folder)
    served = _served(folder, manifest, inputs, rows)
    load_format = inputs.load_format or params.get("load_format")
    engines = manifest.get("engines") or {}
    labels = set(engines) | {f"dcp={r.dcp_size},mem={r.mem_fraction:g}" for r in rows}
    facts = {label: _combo_facts(folder, engine, label, engines.get(label, {}), inputs,
                                 load_format) for label in sorted(labels)}
    out = Rebuilt(folder, [], manifest, served, facts=facts)
    for row in rows:
        out.rows.append(_row(folder, row, samples, served, facts, out))
    intervals = _intervals(manifest)
    seen = set()
    for f, _ in facts.values():
        events = [e for e in f.jit if (e.kernel, e.log_time) not in seen]
        seen.update((e.kernel, e.log_time) for e in events)
        out.jit.extend(h for h in attribute(events, intervals) if h.matched_by == "time")
    _update_manifest(out, inputs, load_format)
    return out


def _row(folder: Path, row: Measurement, samples: dict[str, list[dict[str, Any]]],
         served: ServedModel, facts: dict[str, tuple[EngineFacts, str]],
         out: Rebuilt) -> Measurement:
    if row.kv_bytes_per_token != served.kv_bytes_per_token:
        raise RebuildError(f"{folder}: row {row.source or row.context_tokens} holds "
                           f"kv_bytes_per_token {row.kv_bytes_per_token}, the served model "
                           f"{served.key or '(unknown)'} stores {served.kv_bytes_per_token} "
                           f"B/token at {served.kv_cache_dtype}")
    key: PointKey | None = key_of_row(row)
    requests = samples.get(key.text(), []) if key else []
    update: dict[str, Any] = {}
    if requests:
        try:
            t = point_times([RequestTimes.of(s) for s in requests], batch_size=row.batch_size,
                            prompt_tokens=row.context_tokens)
        except (KeyError, TypeError, ValueError) as exc:
            raise RebuildError(f"{folder}/{SAMPLES}: point {key.text()}: unusable request "
                               f"record ({exc})") from None
        update.update(ttft_s=t.ttft_s, tpot_s=t.tpot_s, decode_step_s=t.decode_step_s,
                      total_s=row.total_s if row.total_s is not None else t.total_s)
        out.from_samples += 1
        out.with_decode_step += t.decode_step_s is not None
    else:
        out.kept += 1
    f, weights = facts[f"dcp={row.dcp_size},mem={row.mem_fraction:g}"]
    update.update(model=served.key, kv_cache_dtype=served.kv_cache_dtype,
                  kv_shards=served.kv_shards, weights=weights,
                  kv_capacity_tokens=f.kv_capacity_tokens,
                  max_running=f.max_running_requested if f.max_running_requested is not None
                  else row.max_running)
    return Measurement.model_validate({**row.model_dump(), **update})


def _update_manifest(out: Rebuilt, inputs: RebuildInputs, load_format: str | None) -> None:
    m = json.loads(json.dumps(out.manifest))         # a copy
    params = m["parameters"]
    for name, value in (("preset", inputs.preset), ("kv_cache_dtype", inputs.kv_cache_dtype),
                        ("load_format", load_format),
                        ("hf_config", config_key(inputs.hf_config) if inputs.hf_config
                         else None)):
        if value is not None:
            params[name] = value
    params.setdefault("kv_shards", 1)
    m["sweep_id"] = sweep_id(params)
    m["served_model"] = out.served.to_json()
    for label, (f, weights) in out.facts.items():
        record = m.setdefault("engines", {}).setdefault(label, {})
        facts = f.to_json()
        facts.pop("jit", None)
        record.update(facts=facts, weights=weights)
    m.setdefault("rebuilt", []).append({
        "time": utc_now(), "rows": len(out.rows), "from_samples": out.from_samples,
        "with_decode_step": out.with_decode_step, "kept": out.kept,
        "inputs": {k: v for k, v in (("preset", inputs.preset),
                                     ("load_format", inputs.load_format),
                                     ("kv_cache_dtype", inputs.kv_cache_dtype),
                                     ("engine_log", inputs.engine_log is not None),
                                     ("metrics", inputs.metrics is not None),
                                     ("server_info", inputs.server_info is not None))
                   if v not in (None, False)},
        "jit": [h.to_json() for h in out.jit]})
    out.manifest = m


def write(rebuilt: Rebuilt) -> None:
    folder = rebuilt.folder
    if rebuilt.served.config is not None:
        atomic_write(folder / MODEL_CONFIG, config_bytes(rebuilt.served.config))
    data = header_csv() + "".join(row_csv(r) for r in rebuilt.rows)
    atomic_write(folder / DATASET, data.encode())
    atomic_write(folder / MANIFEST,
                 (json.dumps(rebuilt.manifest, indent=2, sort_keys=True) + "\n").encode())


def rebuild(folders: list[str | Path], inputs: RebuildInputs) -> list[Rebuilt]:
    """Plan every folder, then write them all (an error writes nothing)."""
    plans = [plan(f, inputs) for f in folders]
    for p in plans:
        write(p)
    return plans
