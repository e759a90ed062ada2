"""Calibration commands: ``engine-advisor fit`` and the ``engine-advisor calibrate ...`` group.

``calibrate run`` sweeps a live (or launched) engine, ``calibrate import`` turns benchmark files
into dataset rows, ``calibrate plan`` suggests what to measure next. The GPU engineer's
``calibrate gpu`` / ``calibrate dcp`` register themselves through ``calibration.gpu_cli``.
"""

from __future__ import annotations

import argparse

from cli.args import fraction_list, int_list
from cli.catalogue import add_hardware_flags


def _fraction(text: str) -> float:
    if "," in text:
        raise argparse.ArgumentTypeError(f"expected one fraction in (0, 1], got {text!r}")
    return fraction_list(text)[0]


def _pos_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _pos_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fit", help="fit the cost model from dataset CSV files",
                       description="Fit the cost model from calibration dataset CSV files (or "
                                   "run folders holding dataset.csv) and write an artifact.")
    p.add_argument("data", nargs="+", metavar="DATA", help="dataset CSV files or run folders")
    p.add_argument("--out", required=True, metavar="ARTIFACT",
                   help="artifact to write: NAME.json (its arrays go to NAME.npz beside it)")
    p.add_argument("--report", metavar="DIR",
                   help="also write a fit report (report.md, report.json, PNG plots) to DIR")
    p.add_argument("--kv-bytes-only", action="store_true",
                   help="fit rows that name no served model's architecture on their KV bytes "
                        "alone (weights and FLOPs unknown)")
    p.add_argument("--force", action="store_true",
                   help="write the artifact even when most rows beat their roofline or the "
                        "held-out error is absurd")
    p.set_defaults(handler=run_fit)

    cal = sub.add_parser("calibrate", help="measure engines: sweep, import, plan",
                         description="Calibration: sweep live engines (run), import their "
                                     "benchmark files (import), suggest the next points (plan).")
    csub = cal.add_subparsers(dest="calibrate_command", required=True, metavar="SUBCOMMAND")
    _register_run(csub)
    _register_import(csub)
    _register_plan(csub)
    _register_model_dir(csub)
    _register_rebuild(csub)
    try:
        from calibration.gpu_cli import register_calibrate
    except ModuleNotFoundError as exc:
        if exc.name != "calibration.gpu_cli":
            raise
    else:
        register_calibrate(csub)


def _register_run(csub: argparse._SubParsersAction) -> None:
    p = csub.add_parser(
        "run", help="sweep an engine endpoint over a grid of points",
        description="Drive a vLLM or SGLang endpoint (--url) or engines started per "
                    "(DCP size, memory fraction) combination (--launch) over contexts x batch "
                    "sizes x repeats; append one dataset row per finished point to "
                    "OUT/dataset.csv. Re-running the same command resumes.")
    p.add_argument("--engine", required=True, choices=("vllm", "sglang"))
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="base URL of a running engine, e.g. http://127.0.0.1:8000")
    where.add_argument("--launch", metavar="TEMPLATE",
                       help="command starting the engine, with {model} {num_gpus} {dcp_size} "
                            "{mem_fraction} {port} placeholders (split like a shell, run "
                            "without one)")
    p.add_argument("--model", help="model name sent in requests (default: the engine's first "
                                   "/v1/models entry)")
    p.add_argument("--contexts", type=int_list, required=True,
                   help="prompt lengths in tokens, e.g. 8192,65536,131072,204800")
    p.add_argument("--output-tokens", type=_pos_int, default=256,
                   help="output tokens per request (default 256)")
    p.add_argument("--batch-sizes", type=int_list, default=[1],
                   help="requests in flight at once per point (default 1)")
    p.add_argument("--repeats", type=_pos_int, default=1, help="repeats per point (default 1)")
    p.add_argument("--dcp-size", "--dcp-sizes", dest="dcp_sizes", type=int_list, default=[1],
                   help="DCP size of the engine (--url: one value; --launch: a list)")
    p.add_argument("--mem-fraction", "--mem-fractions", dest="mem_fractions", type=fraction_list,
                   default=[0.9], help="memory fraction (--url: one value; --launch: a list)")
    p.add_argument("--gpu", default="B300", help="GPU type (default B300)")
    p.add_argument("--num-gpus", type=_pos_int, default=8, help="GPUs = TP size (default 8)")
    _served_model_args(p)
    p.add_argument("--load-format", choices=("dummy", "real"),
                   help="the weights served: random (the engine's --load-format dummy) or a "
                        "checkpoint (default: what the engine states: SGLang's server info, a "
                        "--launch command line, --engine-log; else real)")
    p.add_argument("--engine-log", metavar="FILE",
                   help="--url: the engine's log file, for its start-up facts (memory split, "
                        "KV capacity, chunk size) and the JIT compiles it logs while serving")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the untimed warm-up before each combination's first point")
    p.add_argument("--prompt", choices=("token-ids", "text"), default="token-ids",
                   help="send token-id prompts (default) or text checked against /tokenize")
    p.add_argument("--out", required=True, metavar="DIR", help="run folder (e.g. runs/NAME)")
    p.add_argument("--request-timeout", type=_pos_float, default=600.0,
                   help="seconds one request may take, first byte to last (default 600)")
    p.add_argument("--retries", type=int, default=2,
                   help="re-tries of a point whose requests failed (default 2)")
    p.add_argument("--max-failed-points", type=_pos_int, default=3,
                   help="consecutive failed points after which a sweep (or a launched "
                        "combination) is abandoned (default 3)")
    p.add_argument("--port", type=int, default=0, help="--launch: port (default: a free one)")
    p.add_argument("--startup-timeout", type=_pos_float, default=1800.0,
                   help="--launch: seconds to wait for /health (default 1800)")
    p.add_argument("--stop-grace", type=_pos_float, default=30.0,
                   help="--launch: seconds between SIGTERM and SIGKILL (default 30)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=run_calibrate_run)


def _served_model_args(p: argparse.ArgumentParser) -> None:
    """The served model's architecture: --preset | --hf-config, KV bytes and dtype."""
    arch = p.add_mutually_exclusive_group()
    arch.add_argument("--preset", help="the served model is this built-in preset (default: the "
                                       "engine's model id, when it names a preset or a known "
                                       "Hugging Face id)")
    arch.add_argument("--hf-config", metavar="FILE",
                      help="the served model's Hugging Face config.json (stored with the rows "
                           "when it is no preset)")
    p.add_argument("--kv-bytes-per-token", type=_pos_int,
                   help="KV bytes per token of the model, all layers (default: from the "
                        "architecture at --kv-cache-dtype; required when none is known)")
    p.add_argument("--kv-cache-dtype", choices=("bf16", "fp8"),
                   help="the engine's KV-cache dtype (default bf16, or fp8 when "
                        "--kv-bytes-per-token says so)")
    p.add_argument("--kv-shards", type=_pos_int,
                   help="TP ranks one token's KV is split over (default: from the "
                        "architecture, else 1; 1 for MLA)")


def _register_import(csub: argparse._SubParsersAction) -> None:
    p = csub.add_parser(
        "import", help="turn vllm bench serve / SGLang bench_serving files into dataset rows",
        description="Read benchmark result files and write dataset rows. Per-request arrays "
                    "(--output-details) are used when present. Flags supply what the files lack.")
    p.add_argument("files", nargs="*", metavar="FILE")
    p.add_argument("--format", required=True,
                   choices=("vllm-bench", "sglang-bench", "aiconfigurator"),
                   help="aiconfigurator: a GPU profile (JSON) from aiconfigurator-core's "
                        "measured per-op tables (needs --system; no FILE)")
    p.add_argument("--out", required=True, metavar="CSV",
                   help="dataset CSV to write (aiconfigurator: the GPU profile JSON)")
    p.add_argument("--engine", choices=("vllm", "sglang"),
                   help="engine (default: vllm for vllm-bench, else from the file's backend; "
                        "aiconfigurator: whose tables, default sglang)")
    p.add_argument("--engine-version",
                   help="engine version to record (default: the file's; aiconfigurator: of the "
                        "tables, default the newest per table)")
    p.add_argument("--system", help="aiconfigurator: the system, e.g. b300_sxm, h200_sxm")
    p.add_argument("--systems-dir", metavar="DIR",
                   help="aiconfigurator: a systems directory in the package's layout (default: "
                        "the installed aiconfigurator-core's)")
    p.add_argument("--gpu", default="B300", help="GPU type (default B300)")
    p.add_argument("--num-gpus", type=_pos_int,
                   help="GPUs = TP size (default: the file's server_info, else 8)")
    p.add_argument("--dcp-size", type=_pos_int,
                   help="DCP size (default: the file's server_info, else 1)")
    p.add_argument("--mem-fraction", type=_fraction,
                   help="memory fraction (default: the file's server_info, else 0.9)")
    p.add_argument("--override", action="store_true",
                   help="let --num-gpus/--dcp-size/--mem-fraction/--engine-version win over "
                        "what the files say (default: a contradiction is an error)")
    _served_model_args(p)
    p.add_argument("--load-format", choices=("dummy", "real"),
                   help="the weights served (default: the file's server_info.load_format, "
                        "else real)")
    p.add_argument("--batch-size", type=_pos_int,
                   help="requests in flight (default: max_concurrency, or all requests when "
                        "sent at once)")
    p.add_argument("--append", action="store_true", help="append to an existing CSV")
    p.set_defaults(handler=run_calibrate_import)


def _register_plan(csub: argparse._SubParsersAction) -> None:
    p = csub.add_parser(
        "plan", help="suggest the next points to measure",
        description="Rank (engine, DCP, context) points by how much measuring them would settle "
                    "the recommendation: near the predicted crossover, where intervals overlap, "
                    "outside the calibrated range.")
    p.add_argument("--model", metavar="ARTIFACT", help="fitted model (default: embedded)")
    p.add_argument("--workload", metavar="JSON", help="workload file (the recommend contract)")
    p.add_argument("--context-tokens", type=_pos_int, help="workload context (centre of the scan)")
    p.add_argument("--output-tokens", type=_pos_int, help="output tokens per sequence")
    p.add_argument("--batch-size", type=_pos_int, help="concurrent sequences")
    p.add_argument("--kv-bytes-per-token", type=_pos_int, help="KV bytes per token")
    p.add_argument("--preset", help="a built-in model preset")
    add_hardware_flags(p, default=None)
    p.add_argument("--num-gpus", type=_pos_int, help="GPUs (default 8)")
    p.add_argument("--engines", type=lambda s: [x for x in s.split(",") if x],
                   help="restrict to these engines")
    p.add_argument("--dcp-sizes", type=int_list, help="restrict DCP sizes")
    p.add_argument("--contexts", type=int_list,
                   help="candidate contexts to scan (default: workload context / 8 .. x 8)")
    p.add_argument("--points", type=_pos_int, default=8, help="how many points (default 8)")
    p.add_argument("--include-uncalibrated", action="store_true",
                   help="also suggest configurations without any calibration data")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(handler=run_calibrate_plan)


def _register_model_dir(csub: argparse._SubParsersAction) -> None:
    p = csub.add_parser(
        "model-dir", help="write a model folder an engine serves with --load-format dummy",
        description="Write config.json and an offline word-level tokenizer (the model's vocab "
                    "size) for a preset or a Hugging Face config.json, so that vLLM or SGLang "
                    "can serve the architecture with random weights (--load-format dummy).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a built-in model preset, e.g. deepseek-v2-lite")
    src.add_argument("--hf-config", metavar="FILE", help="a Hugging Face config.json")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write")
    p.add_argument("--max-model-len", type=_pos_int,
                   help="raise max_position_embeddings to this many tokens")
    p.set_defaults(handler=run_calibrate_model_dir)


def _register_rebuild(csub: argparse._SubParsersAction) -> None:
    p = csub.add_parser(
        "rebuild", help="re-derive run folders' dataset rows from their samples",
        description="Re-derive every row of each RUN_DIR's dataset.csv from samples.jsonl and "
                    "manifest.json with the current semantics (batch prefill, decode step, "
                    "served model, engine facts), rewriting the files atomically. Rows without "
                    "samples (out-of-memory points, failed starts) keep their times.")
    p.add_argument("folders", nargs="+", metavar="RUN_DIR")
    arch = p.add_mutually_exclusive_group()
    arch.add_argument("--preset", help="the served model is this preset (default: the "
                                       "manifest's, else the sweep's model name)")
    arch.add_argument("--hf-config", metavar="FILE", help="the served model's config.json")
    p.add_argument("--kv-cache-dtype", choices=("bf16", "fp8"),
                   help="the engine's KV-cache dtype (default: what the KV bytes say)")
    p.add_argument("--load-format", choices=("dummy", "real"),
                   help="the weights served (default: what the engine states, else real)")
    p.add_argument("--engine-log", metavar="FILE",
                   help="the engine's start-up log (memory split, KV capacity, JIT compiles)")
    p.add_argument("--metrics", metavar="FILE", help="the engine's /metrics text")
    p.add_argument("--server-info", metavar="FILE",
                   help="SGLang's /get_server_info answer (JSON)")
    p.set_defaults(handler=run_calibrate_rebuild)


def run_calibrate_rebuild(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from calibration.rebuild import RebuildError, RebuildInputs, rebuild
    from calibration.sweep import read_hf_config
    from cli.errors import CliError

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
    try:
        done = rebuild(args.folders, inputs)
    except RebuildError as exc:
        raise CliError(str(exc)) from None
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
    import json

    from calibration.modeldir import ModelDirError, write_model_dir
    from cli.errors import CliError
    from model.arch.config import ArchConfigError
    from model.arch.presets import preset_config

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
    except ModelDirError as exc:
        raise CliError(str(exc)) from None
    print(f"wrote {folder} (config.json, tokenizer.json, tokenizer_config.json); serve it with "
          "--load-format dummy")
    return 0


def run_fit(args: argparse.Namespace) -> int:
    from calibration.fit import fit_files, format_fit_summary
    from cli.errors import CliError
    from model.dataset import DatasetError

    try:
        model, meta = fit_files(args.data, args.out, kv_bytes_only=args.kv_bytes_only,
                                force=args.force)
    except (DatasetError, ValueError) as exc:
        raise CliError(str(exc)) from None
    print(format_fit_summary(model, meta, args.out))
    if args.report:
        from calibration.fit import read_all
        from calibration.report import write_report

        rows, _ = read_all(args.data)
        paths = write_report(model, rows, args.report)
        print(f"wrote report {paths['markdown']} ({len(paths['plots'])} plots)")
    return 0


def run_calibrate_run(args: argparse.Namespace) -> int:
    from calibration.sweep import run_from_args

    return run_from_args(args)


def run_calibrate_import(args: argparse.Namespace) -> int:
    from cli.errors import CliError

    if args.format == "aiconfigurator":
        from calibration.silicon import import_from_args as import_silicon

        return import_silicon(args)
    if not args.files:
        raise CliError(f"FILE: at least one benchmark file is required with --format {args.format}")
    from calibration.importers import import_from_args

    return import_from_args(args)


def run_calibrate_plan(args: argparse.Namespace) -> int:
    from calibration.plan import plan_from_args

    return plan_from_args(args)
