"""Calibration commands: ``engine-advisor fit`` and the ``engine-advisor calibrate ...`` group.

``calibrate run`` sweeps a live (or launched) engine, ``calibrate import`` turns benchmark files
into dataset rows, ``calibrate plan`` suggests what to measure next. The GPU engineer's ``calibrate
gpu`` / ``calibrate dcp`` register themselves through ``engine_advisor.cli.gpu``. The handlers are
in ``engine_advisor.cli.calibrate_commands``.
"""

from __future__ import annotations

import argparse

from engine_advisor.cli.args import fraction_list, int_list
from engine_advisor.cli.calibrate_commands import (
    run_calibrate_import,
    run_calibrate_model_dir,
    run_calibrate_plan,
    run_calibrate_rebuild,
    run_calibrate_run,
    run_fit,
)
from engine_advisor.cli.catalogue import add_hardware_flags
from engine_advisor.cli.gpu import register_calibrate
from engine_advisor.model import engines


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
    register_calibrate(csub)


def _register_run(csub: argparse._SubParsersAction) -> None:
    p = csub.add_parser(
        "run", help="sweep an engine endpoint over a grid of points",
        description="Drive a vLLM or SGLang endpoint (--url) or engines started per "
                    "(DCP size, memory fraction) combination (--launch) over contexts x batch "
                    "sizes x repeats; append one dataset row per finished point to "
                    "OUT/dataset.csv. Re-running the same command resumes.")
    p.add_argument("--engine", required=True, choices=engines.names())
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
        "import", help="turn vllm bench serve / SGLang bench_serving / TensorRT-LLM "
                       "benchmark_serving and trtllm-bench files into dataset rows",
        description="Read benchmark result files and write dataset rows. Per-request arrays "
                    "(--output-details) are used when present. Flags supply what the files lack.")
    p.add_argument("files", nargs="*", metavar="FILE")
    p.add_argument("--format", required=True,
                   choices=("vllm-bench", "sglang-bench", "trtllm-serving", "trtllm-bench",
                            "aiconfigurator"),
                   help="aiconfigurator: a GPU profile (JSON) from aiconfigurator-core's "
                        "measured per-op tables (needs --system; no FILE)")
    p.add_argument("--out", required=True, metavar="CSV",
                   help="dataset CSV to write (aiconfigurator: the GPU profile JSON)")
    p.add_argument("--engine", choices=engines.names(),
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
