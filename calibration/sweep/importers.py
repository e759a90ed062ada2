"""Import benchmark result files of the engines' own tools as dataset rows.

- ``vllm-bench``: the JSON object ``vllm bench serve --save-result`` writes (also the older
  ``benchmarks/benchmark_serving.py``), or the one-object-per-line file ``--append-result``
  grows: ``duration, completed, num_prompts, max_concurrency, request_rate, backend, model_id,
  total_input_tokens, total_output_tokens, mean_/median_/std_/p99_{ttft,tpot,itl}_ms``, per
  request (``--save-detailed``) ``input_lens, output_lens, ttfts, itls, errors`` (seconds), and
  the ``--metadata KEY=VALUE`` pairs (``version=...`` gives the engine version).
- ``sglang-bench``: the JSONL lines SGLang ``bench_serving`` appends, one per run: the same
  aggregates plus ``*_e2e_latency_ms``, ``concurrency``, ``random_input_len``,
  ``random_output_len``, ``server_info`` (the server's ``/server_info``: ``tp_size``,
  ``dcp_size``, ``mem_fraction_static``, ``version``, ``max_total_num_tokens``) and, with
  ``--output-details``, the per-request arrays.
- ``trtllm-serving`` and ``trtllm-bench``: TensorRT-LLM's ``benchmark_serving`` JSON (vLLM's
  keys) and ``trtllm-bench --report_json`` reports
  (``engine_advisor.calibration.sweep.import_trtllm``).

What a file says about the server (TP size, DCP size, memory fraction, version) fills the row;
a flag that says otherwise is an error naming both values unless ``override`` (``--override``)
lets the flags win. The KV capacity (``max_total_num_tokens``) is checked against the batch:
a batch whose KV does not fit at once ran in fewer concurrent sequences (a warning).

One file entry (a vLLM file, a SGLang line) becomes one row:

- ``batch_size``: ``max_concurrency``, else the number of requests when they were all sent at
  once (``request_rate`` inf), else ``--batch-size``;
- one wave (requests <= batch): ``total_s`` = ``duration``, ``ttft_s`` = the batch's first send
  -> its last first token (the batch's prefill, as ``calibrate run`` records it) from vLLM's
  per-request ``start_times`` (``--save-detailed``); without them (SGLang's files) the last
  request's TTFT, counted from its own send, which the client's send spread (a few ms) shortens; p99
  TTFT when there are no per-request arrays; ``tpot_s`` = mean per-request TPOT, computed from the
  arrays as (TTFT + sum(ITL) - TTFT) / (n - 1) when present; ``decode_step_s`` = the pure decode
  step of the whole batch (``engine_advisor.calibration.sweep.streams``: the median inter-token gap
  while every request has its first token and none has finished), from the per-request ``ttfts`` and
  ``itls`` (and ``start_times`` when present, else every request counted from one send). Without
  per-request arrays only a single request's file gives it (its ``median_itl_ms``: at batch 1 every
  gap is a decode step); a batch's aggregate ITL mixes in the steps that carried other requests'
  prefill, so no decode step is recorded then;
- several waves: only ``tpot_s`` (a steady-state batch has no single prefill, total time or
  decode step).

The served model's architecture (``engine_advisor.calibration.sweep.served_model``): ``--preset`` /
``--hf-config``, else the file's ``model_id`` (vLLM) or ``server_info.served_model_name`` /
``model_path`` (SGLang) when it names a preset or a known Hugging Face id;
``--kv-bytes-per-token`` is then optional (from the architecture at ``--kv-cache-dtype``).
``kv_capacity_tokens`` comes from ``server_info.max_total_num_tokens``, ``max_running`` from
``server_info.max_running_requests`` (the limit as launched; empty: the engine's default),
``weights`` from ``--load-format``, else ``server_info.load_format``, else ``real``.

Every file is parsed before anything is written; an error names the file and line and writes
nothing.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.calibration.sweep.engine_facts import EngineFacts
from engine_advisor.calibration.sweep.engine_sources import FactsError, weights_of
from engine_advisor.calibration.sweep.honesty import overhead_warnings, resolution_of
from engine_advisor.calibration.sweep.import_trtllm import FORMATS as TRTLLM_FORMATS
from engine_advisor.calibration.sweep.import_trtllm import ReportError, bench_report
from engine_advisor.calibration.sweep.served_model import ServedModelError, resolve_served_model
from engine_advisor.calibration.sweep.streams import Stream, stream_times
from engine_advisor.model.diskio import atomic_write, file_kind
from engine_advisor.model.errors import DiskError
from engine_advisor.model.fit.dataset import Measurement, header_csv, read_csv, row_csv


class BenchFileError(CalibrationError, ValueError):
    """A malformed benchmark file: ``path:line: problem``."""

    def __init__(self, path: str, line: int, message: str):
        super().__init__(f"{path}:{line}: {message}")


@dataclass
class Defaults:
    """What the benchmark files lack, from the command line (None: not given)."""

    gpu: str = "B300"
    num_gpus: int | None = None
    dcp_size: int | None = None
    mem_fraction: float | None = None
    kv_bytes_per_token: int | None = None
    kv_shards: int | None = None
    engine: str | None = None
    engine_version: str | None = None
    batch_size: int | None = None
    override: bool = False
    preset: str | None = None
    hf_config: dict[str, Any] | None = None
    kv_cache_dtype: str | None = None
    load_format: str | None = None


FALLBACK = {"num_gpus": 8, "dcp_size": 1, "mem_fraction": 0.9, "engine_version": ""}
FLAGS = {"num_gpus": "--num-gpus", "dcp_size": "--dcp-size", "mem_fraction": "--mem-fraction",
         "engine_version": "--engine-version"}
VERSION_KEYS = ("version", "engine_version", "vllm_version", "sglang_version")


ENGINE_OF_BACKEND = (("sglang", "sglang"), ("vllm", "vllm"), ("openai", None))


def _num(obj: dict[str, Any], key: str, where: tuple[str, int], *, required: bool = True,
         positive: bool = False) -> float | None:
    v = obj.get(key)
    if v is None:
        if required:
            raise BenchFileError(*where, f"missing field {key!r}")
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        if v == "inf" or v == "Infinity":
            return math.inf
        raise BenchFileError(*where, f"field {key!r} must be a number, got {v!r}")
    v = float(v)
    if math.isnan(v) or (positive and not v > 0):
        raise BenchFileError(*where, f"field {key!r} must be a positive number, got {v!r}")
    return v


def _array(obj: dict[str, Any], key: str, n: int, where: tuple[str, int]) -> list | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, list):
        raise BenchFileError(*where, f"field {key!r} must be a list")
    if len(v) != n:
        raise BenchFileError(*where, f"field {key!r} has {len(v)} entries, expected {n} (one per "
                                   "request)")
    return v


def _engine(obj: dict[str, Any], fmt: str, d: Defaults, where: tuple[str, int]) -> str:
    if d.engine:
        return d.engine
    if fmt in TRTLLM_FORMATS:           # TensorRT-LLM's own tools (backend "openai")
        return "trtllm"
    backend = str(obj.get("backend") or "").lower()
    for prefix, engine in ENGINE_OF_BACKEND:
        if backend.startswith(prefix) and engine:
            return engine
    if fmt == "vllm-bench" and not backend.startswith("sglang"):
        return "vllm"
    raise BenchFileError(*where, f"cannot tell the engine from backend {backend!r}; give --engine")


def server_facts(obj: dict[str, Any], where: tuple[str, int]) -> dict[str, Any]:
    """What a result object says about the server: num_gpus, dcp_size, mem_fraction,
    engine_version, kv_capacity_tokens, max_running (only the keys it states)."""
    facts: dict[str, Any] = {}
    for key in VERSION_KEYS:            # vLLM: --metadata version=...
        if isinstance(obj.get(key), str | int | float) and str(obj[key]).strip():
            facts["engine_version"] = str(obj[key]).strip()
            break
    info = obj.get("server_info")
    if info is None:
        return facts
    if not isinstance(info, dict):
        raise BenchFileError(*where, "field 'server_info' must be an object")
    if isinstance(info.get("decode"), list) and info["decode"]:    # PD disaggregation
        info = info["decode"][0]
    spec = (("num_gpus", ("tp_size",), int), ("dcp_size", ("dcp_size",
            "decode_context_parallel_size"), int), ("mem_fraction", ("mem_fraction_static",),
            float), ("engine_version", ("version",), str),
            ("kv_capacity_tokens", ("max_total_num_tokens",), int))
    states = info.get("internal_states")
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) \
        else {}
    for name, keys, kind in spec:
        for key in keys:
            v = info.get(key, state.get(key))
            if v is None:
                continue
            if kind is str:
                facts[name] = str(v)
            elif isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 \
                    or (kind is int and v != int(v)):
                raise BenchFileError(*where, f"server_info.{key}: expected a positive "
                                           f"{'integer' if kind is int else 'number'}, got {v!r}")
            else:
                facts[name] = kind(v)
            break
    # the running-request limit as launched (the server argument; None: SGLang's default)
    v = info.get("max_running_requests")
    if v is not None:
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 or v != int(v):
            raise BenchFileError(*where, "server_info.max_running_requests: expected a positive "
                                       f"integer, got {v!r}")
        facts["max_running"] = int(v)
    return facts


def _resolve(facts: dict[str, Any], d: Defaults, where: tuple[str, int]) -> dict[str, Any]:
    """The row's server settings: the file's, else the flags', else the defaults; a flag that
    contradicts the file is an error (``override``: the flag wins)."""
    out = {}
    for name, fallback in FALLBACK.items():
        flag, stated = getattr(d, name), facts.get(name)
        if stated is None:
            out[name] = fallback if flag is None else flag
        elif flag is None or flag == stated or d.override:
            out[name] = stated if flag is None else flag
        else:
            raise BenchFileError(*where, f"{FLAGS[name]} {flag} contradicts the file, which "
                                       f"says {stated} (server_info or metadata); drop the "
                                       "flag, or give --override to let the flags win")
    return out


def entry_to_row(obj: Any, fmt: str, d: Defaults, where: tuple[str, int]) -> Measurement:
    """One benchmark result object -> one dataset row."""
    if not isinstance(obj, dict):
        raise BenchFileError(*where, f"expected a JSON object, got {type(obj).__name__}")
    completed = _num(obj, "completed", where)
    if completed is None or completed < 1 or completed != int(completed):
        raise BenchFileError(*where, f"field 'completed' must be a positive integer, got "
                                   f"{obj.get('completed')!r} (no request succeeded?)")
    completed = int(completed)
    duration = _num(obj, "duration", where, positive=True)
    errors_list = obj.get("errors")
    failed = _num(obj, "failed", where, required=False)
    n_requests = _num(obj, "num_prompts", where, required=False)
    if n_requests is None:
        for key in ("ttfts", "input_lens", "output_lens"):
            if isinstance(obj.get(key), list):
                n_requests = len(obj[key])
                break
    n_requests = int(n_requests or completed + int(failed or 0))
    if n_requests < completed:
        raise BenchFileError(*where, f"'completed' {completed} exceeds the {n_requests} requests")
    errors = int(failed) if failed is not None else (
        sum(1 for e in errors_list if e) if isinstance(errors_list, list) else 0)

    ttfts = _array(obj, "ttfts", n_requests, where)
    itls = _array(obj, "itls", n_requests, where)
    in_lens = _array(obj, "input_lens", n_requests, where)
    out_lens = _array(obj, "output_lens", n_requests, where)
    errs = _array(obj, "errors", n_requests, where) if isinstance(errors_list, list) else None
    ok = [i for i in range(n_requests) if not (errs and errs[i])]
    if ttfts is not None:
        ok = [i for i in ok if isinstance(ttfts[i], int | float) and ttfts[i] > 0]

    # context and output lengths
    if in_lens is not None and ok:
        context = _mean_int([in_lens[i] for i in ok], "input_lens", where)
    else:
        context = obj.get("random_input_len") or _per_request(obj, "total_input_tokens", completed,
                                                              where)
    if out_lens is not None and ok:
        output = _mean_int([out_lens[i] for i in ok], "output_lens", where)
    else:
        output = obj.get("random_output_len") or _per_request(obj, "total_output_tokens",
                                                              completed, where)

    # batch size
    rate = obj.get("request_rate")
    all_at_once = rate is None or rate in ("inf", "Infinity") or (
        isinstance(rate, int | float) and math.isinf(rate))
    maxc = obj.get("max_concurrency")
    if d.batch_size:
        batch = d.batch_size
    elif isinstance(maxc, int) and maxc > 0:
        batch = min(maxc, n_requests)
    elif all_at_once:
        batch = n_requests
    else:
        raise BenchFileError(*where, f"request_rate {rate} with no max_concurrency: the number of "
                                   "requests in flight is not fixed; give --batch-size")
    one_wave = n_requests <= batch

    # times
    tpot = ttft = step = None
    if ttfts is not None and itls is not None and ok:
        tpots = []
        for i in ok:
            gaps = itls[i]
            if not isinstance(gaps, list) or not all(isinstance(g, int | float) for g in gaps):
                raise BenchFileError(*where, f"itls[{i}] must be a list of seconds")
            n = int(out_lens[i]) if out_lens is not None else len(gaps) + 1
            if n > 1 and gaps:
                tpots.append(float(sum(gaps)) / (n - 1))
        tpot = sum(tpots) / len(tpots) if tpots else None
        if one_wave:
            ttft = _batch_ttft(obj, ttfts, ok, n_requests, where)
            step = _decode_step(obj, ttfts, itls, ok, n_requests, int(context), where)
    if step is None and one_wave and n_requests == 1 and ttfts is None:
        ms = _num(obj, "median_itl_ms", where, required=False)
        step = ms / 1e3 if ms else None
    if tpot is None:
        ms = _num(obj, "mean_tpot_ms", where, required=False)
        tpot = ms / 1e3 if ms else None
    if ttft is None and one_wave:
        ms = _num(obj, "p99_ttft_ms", where, required=False) or _num(
            obj, "mean_ttft_ms", where, required=False)
        ttft = ms / 1e3 if ms else None
    total = duration if one_wave else None
    if tpot is None and total is None:
        raise BenchFileError(*where, "no usable time: needs mean_tpot_ms or per-request ttfts/itls")
    facts = server_facts(obj, where)
    server = _resolve(facts, d, where)
    served = _served_model(obj, d, server["num_gpus"], where)
    weights = _weights(obj, d, where)
    capacity = facts.get("kv_capacity_tokens")
    if capacity is not None and batch * (int(context) + int(output)) > capacity:
        warn(f"{where[0]}:{where[1]}: {batch} sequences of {int(context)} + {int(output)} "
             f"tokens need more KV than the server's capacity of {capacity} tokens: fewer ran "
             "at once than the batch size says")
    limit = facts.get("max_running")
    if limit is not None and batch > limit:
        warn(f"{where[0]}:{where[1]}: batch {batch} exceeds the server's max_running_requests "
             f"{limit}: at most {limit} ran at once")

    try:
        row = Measurement(
            engine=_engine(obj, fmt, d, where), engine_version=server["engine_version"],
            gpu=d.gpu, num_gpus=server["num_gpus"], dcp_size=server["dcp_size"],
            mem_fraction=server["mem_fraction"],
            context_tokens=int(context), output_tokens=int(output), batch_size=batch,
            kv_bytes_per_token=served.kv_bytes_per_token, kv_shards=served.kv_shards,
            ttft_s=ttft, tpot_s=tpot, total_s=total, errors=errors,
            source=f"import:{fmt}:{Path(where[0]).name}:{where[1]}", model=served.key,
            kv_cache_dtype=served.kv_cache_dtype, decode_step_s=step,
            kv_capacity_tokens=capacity, weights=weights, max_running=limit)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise BenchFileError(*where, f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    res = resolution_of(obj.get("server_info"))
    for message in overhead_warnings(row, res) if res else []:
        warn(f"{where[0]}:{where[1]}: measured against engine-advisor sim: {message}")
    return row


def _model_id(obj: dict[str, Any]) -> str | None:
    """The served model's name a result states (vLLM ``model_id``; SGLang's server info)."""
    info = obj.get("server_info") if isinstance(obj.get("server_info"), dict) else {}
    for v in (obj.get("model_id"), obj.get("model"), info.get("served_model_name"),
              info.get("model_path")):
        if isinstance(v, list) and v:
            v = v[0]
        if isinstance(v, str) and v.strip():
            return v.strip()
    return None


def _served_model(obj: dict[str, Any], d: Defaults, num_gpus: int, where: tuple[str, int]):
    try:
        served = resolve_served_model(
            preset_name=d.preset, hf_config=d.hf_config, model_id=_model_id(obj),
            kv_bytes_per_token=d.kv_bytes_per_token, kv_cache_dtype=d.kv_cache_dtype,
            kv_shards=d.kv_shards, num_gpus=num_gpus)
    except ServedModelError as exc:
        raise BenchFileError(*where, str(exc)) from None
    if served.note:
        warn(f"{where[0]}:{where[1]}: {served.note}")
    return served


def _weights(obj: dict[str, Any], d: Defaults, where: tuple[str, int]) -> str:
    info = obj.get("server_info")
    facts = EngineFacts()
    if isinstance(info, dict) and isinstance(info.get("load_format"), str):
        facts._set("load_format", info["load_format"], "server_info")
    try:
        return weights_of(facts, d.load_format)
    except FactsError as exc:
        raise BenchFileError(*where, str(exc)) from None


def _decode_step(obj: dict[str, Any], ttfts: list, itls: list, ok: list[int], n: int,
                 context: int, where: tuple[str, int]) -> float | None:
    """The batch's pure decode step from its requests' streams
    (``engine_advisor.calibration.sweep.streams``)."""
    starts = _array(obj, "start_times", n, where)
    t0 = min(map(float, starts)) if starts is not None else 0.0
    streams = [Stream.of(float(starts[i]) - t0 if starts is not None else 0.0, float(ttfts[i]),
                         [float(g) for g in itls[i]]) for i in ok]
    return stream_times(streams, context).decode_step_s


def _batch_ttft(obj: dict[str, Any], ttfts: list, ok: list[int], n: int,
                where: tuple[str, int]) -> float:
    """First send -> last first token when the file has the send times (vLLM's
    ``start_times``, one clock), else the longest TTFT."""
    starts = _array(obj, "start_times", n, where)
    if starts is None:
        return max(float(ttfts[i]) for i in ok)
    if not all(isinstance(x, int | float) and math.isfinite(x) for x in starts):
        raise BenchFileError(*where, "field 'start_times' must hold numbers (seconds)")
    return max(float(starts[i]) + float(ttfts[i]) for i in ok) - min(map(float, starts))


def _mean_int(values: list, name: str, where: tuple[str, int]) -> int:
    if not all(isinstance(v, int | float) and v > 0 for v in values):
        raise BenchFileError(*where, f"field {name!r} must hold positive token counts")
    return max(1, round(sum(values) / len(values)))


def _per_request(obj: dict[str, Any], key: str, completed: int, where: tuple[str, int]) -> int:
    total = _num(obj, key, where, positive=True)
    return max(1, round(total / completed))


def read_file(path: str, fmt: str, d: Defaults) -> list[Measurement]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchFileError(path, 0, f"cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise BenchFileError(path, 0, "not UTF-8 text") from None
    if fmt in ("vllm-bench", "trtllm-serving"):
        return [entry_to_row(obj, fmt, d, (path, line)) for line, obj in _json_objects(path, text)]
    if fmt == "trtllm-bench":
        rows = []
        for line, obj in _json_objects(path, text):
            try:
                entry = bench_report(obj, d.batch_size)
            except ReportError as exc:
                raise BenchFileError(path, line, str(exc)) from None
            rows.append(entry_to_row(entry, fmt, d, (path, line)))
        return rows
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchFileError(path, lineno, f"not valid JSON ({exc.msg} at column "
                                             f"{exc.colno})") from None
        rows.append(entry_to_row(obj, fmt, d, (path, lineno)))
    if not rows:
        raise BenchFileError(path, 1, "no result lines")
    return rows


def _json_objects(path: str, text: str) -> list[tuple[int, Any]]:
    """(line, object) of each JSON value in ``text``: one (--save-result, maybe indented) or
    several, one a line (--append-result)."""
    decoder = json.JSONDecoder()
    out = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            break
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise BenchFileError(path, exc.lineno, f"not valid JSON ({exc.msg})") from None
        out.append((text.count("\n", 0, pos) + 1, obj))
        pos = end
    if not out:
        raise BenchFileError(path, 1, "no result object")
    return out


def warn(message: str) -> None:
    print(f"engine-advisor: warning: {message}", file=sys.stderr)


def import_files(paths: list[str], fmt: str, d: Defaults) -> list[Measurement]:
    rows: list[Measurement] = []
    for path in paths:
        rows.extend(read_file(path, fmt, d))
    return rows


def write_rows(out: str, rows: list[Measurement], append: bool) -> None:
    """Write (or append to) a dataset CSV atomically: the file is whole or unchanged (a full or
    read-only disk raises ``engine_advisor.model.errors.DiskError`` naming the file and the
    cause)."""
    p = Path(out)
    existing: list[Measurement] = []
    kind = file_kind(p.stat().st_mode) if p.exists() else None
    if kind is not None:
        raise DiskError(None, None, out, f"{kind}; --out names the dataset CSV to write")
    if p.exists():
        if not append:
            raise FileExistsError(f"--out {out} exists; use --append to add rows to it")
        existing = read_csv(p)
    data = header_csv() + "".join(row_csv(r) for r in existing + rows)
    atomic_write(p, data.encode())
