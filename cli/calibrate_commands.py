"""The handlers of ``engine-advisor fit`` and ``calibrate run|import|plan|model-dir|rebuild``:
each reads its flags into the calibration library's typed arguments, calls the library and
prints the result. Heavy imports happen inside the handlers."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from engine_advisor.cli.errors import CliError


def run_calibrate_rebuild(args: argparse.Namespace) -> int:
    from engine_advisor.calibration.sweep.config import read_hf_config
    from engine_advisor.calibration.sweep.rebuild import RebuildInputs, rebuild

    def text(path: str | None, flag: str) -> str | None:
        if path is None:
            return None
        try:
            return Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise CliError(f"{flag}: cannot read {path} ({exc.strerror})") from None

    info = text(args.server_info, "--server-info")
    try:
        server_info = json.loads(info) if info is not None else None
        hf_config = read_hf_config(args.hf_config)
    except json.JSONDecodeError as exc:
        raise CliError(f"--server-info: {args.server_info} is not JSON ({exc.msg})") from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if server_info is not None and not isinstance(server_info, dict):
        raise CliError(f"--server-info: {args.server_info} is not a JSON object")
    inputs = RebuildInputs(preset=args.preset, hf_config=hf_config,
                           kv_cache_dtype=args.kv_cache_dtype, load_format=args.load_format,
                           engine_log=text(args.engine_log, "--engine-log"),
                           metrics=text(args.metrics, "--metrics"), server_info=server_info)
    done = rebuild(args.folders, inputs)
    for r in done:
        caps = sorted({f.kv_capacity_tokens for f, _ in r.facts.values()
                       if f.kv_capacity_tokens})
        weights = sorted({w for _, w in r.facts.values()})
        print(f"rebuilt {r.folder}: {len(r.rows)} rows ({r.from_samples} from samples, "
              f"{r.with_decode_step} with a decode step, {r.kept} kept as they were); model "
              f"{r.served.key or '(unknown: KV bytes only)'}; weights {', '.join(weights)}; "
              f"KV capacity {', '.join(map(str, caps)) or 'unknown'}"
              + "".join(f"\n  JIT compile of {h.kernel} at {h.log_time} during {h.during}"
                        for h in r.jit))
    return 0


def run_calibrate_model_dir(args: argparse.Namespace) -> int:
    from engine_advisor.calibration.sweep.modeldir import write_model_dir
    from engine_advisor.model.arch.config import ArchConfigError
    from engine_advisor.model.arch.presets import preset_config

    try:
        if args.preset:
            config = preset_config(args.preset)
        else:
            config = json.loads(open(args.hf_config, encoding="utf-8").read())
            if not isinstance(config, dict):
                raise CliError(f"--hf-config: {args.hf_config} is not a JSON object")
        folder = write_model_dir(config, args.out, max_model_len=args.max_model_len)
    except ArchConfigError as exc:
        raise CliError(f"--preset: {exc}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise CliError(f"--hf-config: {exc}") from None
    print(f"wrote {folder} (config.json, tokenizer.json, tokenizer_config.json); serve it with "
          "--load-format dummy")
    return 0


def run_fit(args: argparse.Namespace) -> int:
    from engine_advisor.calibration.fit.fitter import fit_files, format_fit_summary
    from engine_advisor.model.fit.dataset import DatasetError

    try:
        model, meta = fit_files(args.data, args.out, kv_bytes_only=args.kv_bytes_only,
                                force=args.force)
    except (DatasetError, ValueError) as exc:
        raise CliError(str(exc)) from None
    print(format_fit_summary(model, meta, args.out))
    if args.report:
        from engine_advisor.calibration.fit.fitter import read_all
        from engine_advisor.calibration.fit.report import write_report

        rows, _ = read_all(args.data)
        paths = write_report(model, rows, args.report)
        print(f"wrote report {paths['markdown']} ({len(paths['plots'])} plots)")
    return 0


def run_calibrate_run(args: argparse.Namespace) -> int:
    from engine_advisor.calibration.sweep.config import SweepConfig, read_hf_config
    from engine_advisor.calibration.sweep.driver import Sweep
    from engine_advisor.calibration.sweep.launcher import LaunchTemplateError
    from engine_advisor.calibration.sweep.outcome import summary_table
    from engine_advisor.calibration.sweep.stop import SweepAbort
    from engine_advisor.model.errors import DiskError

    try:
        cfg = SweepConfig(
            engine=args.engine, contexts=args.contexts,
            kv_bytes_per_token=args.kv_bytes_per_token, out=args.out, url=args.url,
            launch=args.launch, model=args.model, output_tokens=args.output_tokens,
            batch_sizes=args.batch_sizes, repeats=args.repeats, dcp_sizes=args.dcp_sizes,
            mem_fractions=args.mem_fractions, gpu=args.gpu, num_gpus=args.num_gpus,
            kv_shards=args.kv_shards, prompt=args.prompt, seed=args.seed,
            request_timeout=args.request_timeout, retries=args.retries,
            max_failed_points=args.max_failed_points, port=args.port,
            startup_timeout=args.startup_timeout, stop_grace=args.stop_grace,
            progress=not args.no_progress, preset=args.preset,
            hf_config=read_hf_config(args.hf_config), kv_cache_dtype=args.kv_cache_dtype,
            load_format=args.load_format, engine_log=args.engine_log,
            warmup=not args.no_warmup)
        cfg.validate()
    except (ValueError, LaunchTemplateError) as exc:
        raise CliError(str(exc)) from None
    try:
        sweep = Sweep(cfg)
    except OSError as exc:
        raise CliError(str(exc)) from None
    previous = {sig: signal.signal(sig, sweep.stop.handler)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        outcomes = sweep.run()
    except SweepAbort:
        if sweep.outcomes:
            print(summary_table(sweep.outcomes))
        raise
    except KeyboardInterrupt:
        print(f"engine-advisor: stopped; {len(sweep.store.done)} points are recorded in "
              f"{sweep.store.dataset_path}; re-run the same command to resume", file=sys.stderr)
        raise
    except DiskError as exc:        # a full or read-only disk under the run folder
        n = len(sweep.store.done)
        raise CliError(f"{exc}; {n} point{'s are' if n != 1 else ' is'} recorded in "
                       f"{sweep.store.dataset_path}; free space (or make it writable) and "
                       "re-run the same command to resume") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if outcomes:
        print(summary_table(outcomes))
    failed = [o for o in outcomes if o.row is None]
    print(f"\n{len(sweep.store.done)} points recorded in {sweep.store.dataset_path}"
          + (f"; {len(failed)} failed and will be retried by the same command "
             f"(details in {sweep.store.folder}/events.jsonl)" if failed else ""))
    return 1 if failed else 0


def run_calibrate_import(args: argparse.Namespace) -> int:
    if args.format == "aiconfigurator":
        return _import_silicon(args)
    if not args.files:
        raise CliError(f"FILE: at least one benchmark file is required with --format {args.format}")
    from engine_advisor.calibration.sweep.config import read_hf_config
    from engine_advisor.calibration.sweep.importers import Defaults, import_files, write_rows
    from engine_advisor.model.fit.dataset import DatasetError

    try:
        hf_config = read_hf_config(args.hf_config)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    d = Defaults(gpu=args.gpu, num_gpus=args.num_gpus, dcp_size=args.dcp_size,
                 mem_fraction=args.mem_fraction, kv_bytes_per_token=args.kv_bytes_per_token,
                 kv_shards=args.kv_shards, engine=args.engine,
                 engine_version=args.engine_version, batch_size=args.batch_size,
                 override=args.override, preset=args.preset, hf_config=hf_config,
                 kv_cache_dtype=args.kv_cache_dtype, load_format=args.load_format)
    try:
        rows = import_files(args.files, args.format, d)
        write_rows(args.out, rows, args.append)
    except (DatasetError, FileExistsError) as exc:
        raise CliError(str(exc)) from None
    print(f"imported {len(rows)} rows from {len(args.files)} file(s) into {args.out}")
    for r in rows:
        print(f"  {r.engine} dcp {r.dcp_size} ctx {r.context_tokens} out {r.output_tokens} "
              f"batch {r.batch_size}: TTFT {_fmt(r.ttft_s)} step "
              f"{_fmt(r.decode_step_s, 1e3, 'ms')} TPOT {_fmt(r.tpot_s, 1e3, 'ms')} "
              f"total {_fmt(r.total_s)} model {r.model or '(KV bytes only)'}")
    return 0


def _fmt(v: float | None, scale: float = 1.0, unit: str = "s") -> str:
    return f"{v * scale:.3f} {unit}" if v is not None else "-"


def _import_silicon(args: argparse.Namespace) -> int:
    """``calibrate import --format aiconfigurator``: a GPU profile from NVIDIA's tables."""
    from engine_advisor.calibration.silicon.importer import build_profile, summary, write_profile

    if not args.system:
        raise CliError("--system: required with --format aiconfigurator (e.g. b300_sxm)")
    if args.files:
        raise CliError("--format aiconfigurator: takes no FILE arguments (the tables come from "
                       "the installed package or --systems-dir)")
    command = " ".join(["engine-advisor calibrate import --format aiconfigurator",
                        f"--system {args.system}",
                        *([f"--engine {args.engine}"] if args.engine else []),
                        *([f"--engine-version {args.engine_version}"]
                          if args.engine_version else []),
                        f"--out {args.out}"])
    prof = build_profile(args.system, args.engine or "sglang", args.engine_version or None,
                         args.systems_dir, command)
    try:
        write_profile(Path(args.out), prof)
    except OSError as exc:
        raise CliError(f"--out: cannot write {args.out}: {exc.strerror or exc}") from None
    print(summary(prof))
    print(f"wrote {args.out}")
    return 0


# workload field -> the calibrate plan flag that sets it
PLAN_FLAGS = {"context_tokens": "--context-tokens", "output_tokens": "--output-tokens",
              "batch_size": "--batch-size", "kv_bytes_per_token": "--kv-bytes-per-token",
              "preset": "--preset", "gpu": "--gpu", "num_gpus": "--num-gpus",
              "engines": "--engines", "dcp_sizes": "--dcp-sizes"}


def run_calibrate_plan(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from engine_advisor.calibration.sweep.plan import commands, plan
    from engine_advisor.cli.common import load_model, read_json_file, validation_message
    from engine_advisor.model.workload import Workload

    data = dict(read_json_file(args.workload, "--workload")) if args.workload else {}
    if not isinstance(data, dict):
        raise CliError(f"--workload {args.workload}: expected a JSON object")
    for field in PLAN_FLAGS:
        v = getattr(args, field, None)
        if v is not None:
            data[field] = v
    if getattr(args, "gpu_spec", None) is not None:
        data["gpu"] = args.gpu_spec
    data.setdefault("context_tokens", 65536)
    data.setdefault("output_tokens", 256)
    if not any(k in data for k in ("kv_bytes_per_token", "preset", "hf_config")):
        raise CliError("give --kv-bytes-per-token, --preset or a --workload file with one")
    data["allow_extrapolation"] = True
    try:
        w = Workload.model_validate(data)
    except ValidationError as exc:
        raise CliError(validation_message(exc, PLAN_FLAGS)) from None
    model = load_model(args.model)
    points = plan(model, w, args.contexts, args.points, args.include_uncalibrated)
    if args.json:
        from dataclasses import asdict

        print(json.dumps({"model_version": model.version, "points": [asdict(p) for p in points],
                          "commands": commands(points, w)}, indent=2))
        return 0
    if not points:
        print("nothing to measure: no configuration's ranking is in doubt on this grid")
        return 0
    head = (f"{'engine':<8}{'dcp':>4}{'context':>10}{'batch':>6}{'out':>6}{'pred s':>10}"
            f"{'90% interval':>20}{'P(flip)':>9}  why")
    print(head)
    print("-" * len(head))
    for p in points:
        lo, hi = p.interval_s
        print(f"{p.engine:<8}{p.dcp_size:>4}{p.context_tokens:>10,}{p.batch_size:>6}"
              f"{p.output_tokens:>6}{p.predicted_total_s:>10.2f}{f'[{lo:.2f}, {hi:.2f}]':>20}"
              f"{p.flip_probability:>9.0%}  {'; '.join(p.reasons) or '-'}")
    print("\nTo measure them:")
    for c in commands(points, w):
        print("  " + c)
    return 0
