"""``engine-advisor sim``: run an OpenAI-compatible server that behaves like vLLM or SGLang."""

from __future__ import annotations

import argparse
import sys

from engine_advisor.cli.catalogue import add_hardware_flags
from engine_advisor.sim import engines as sim_engines


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim", help="run an engine simulator (OpenAI-compatible, vLLM or SGLang flavoured)",
        description="Run an OpenAI-compatible server that behaves like vLLM or SGLang (endpoints, "
                    "metrics, errors, startup logs) with timing from the cost model.")
    p.add_argument("--engine", choices=sim_engines.names(), required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--model-name", default="kimi-k3", help="served model name (default kimi-k3)")
    add_hardware_flags(p)
    p.add_argument("--num-gpus", type=int, default=8, help="tensor-parallel GPUs (default 8)")
    p.add_argument("--dcp-size", type=int, default=1, help="decode context parallel size (1)")
    p.add_argument("--mem-fraction", type=float, default=0.9,
                   help="--gpu-memory-utilization / --mem-fraction-static (default 0.9)")
    p.add_argument("--kv-bytes-per-token", type=int, default=27_648,
                   help="KV bytes per token, all layers (default 27648: Kimi-K3, 24 MLA "
                        "layers, bf16)")
    p.add_argument("--kv-shards", type=int, default=1,
                   help="ranks the KV heads are split over (1 for MLA; default 1)")
    p.add_argument("--weight-bytes", type=float, default=None,
                   help="model weight bytes, subtracted from the KV budget (default: the "
                        "preset --model-name names, else 0)")
    p.add_argument("--model", metavar="ARTIFACT",
                   help="fitted cost-model artifact giving the hidden timing coefficients "
                        "(default: the embedded model)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply every simulated duration (0.001: 100 s take 0.1 s)")
    p.add_argument("--max-running", "--max-num-seqs", "--max-running-requests",
                   dest="max_running", type=int, default=None, metavar="N",
                   help="the running-request limit as launched (vLLM --max-num-seqs, SGLang "
                        "--max-running-requests); the rest wait. Default: the engine's own "
                        "(vLLM 1024 on GPUs of 70 GiB and more, else 256; SGLang from its "
                        "pools)")
    p.add_argument("--max-mamba-cache-size", type=int, default=None, metavar="N",
                   help="SGLang, hybrid models: state slots of the state pool (default: "
                        "--mamba-full-memory-ratio's share of the memory)")
    p.add_argument("--mamba-full-memory-ratio", type=float, default=None, metavar="R",
                   help="SGLang, hybrid models: state pool : KV pool memory, 0 < R <= 10 "
                        "(default 0.9)")
    p.add_argument("--max-model-len", type=int, default=262_144,
                   help="context length limit in tokens (default 262144)")
    p.add_argument("--fail-rate", type=float, default=0.0,
                   help="share of requests failing with 429/500/503 (default 0)")
    p.add_argument("--startup-seconds", type=float, default=0.0,
                   help="/health answers 503 for this long after start (default 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of generated text and faults")
    p.add_argument("--oom-threshold", type=float, default=0.95,
                   help="memory fraction at/above which CUDA OOM failures start (default 0.95)")
    p.add_argument("--oom-rate", type=float, default=0.05,
                   help="share of requests failing with CUDA out of memory at/above the "
                        "threshold (default 0.05)")
    p.add_argument("--oom-on-startup", action="store_true",
                   help="at/above the threshold, fail at startup (exit 1) instead")
    p.add_argument("--disable-prefix-caching", "--disable-radix-cache",
                   dest="disable_prefix_caching", action="store_true",
                   help="no prefix cache (vLLM --no-enable-prefix-caching, SGLang "
                        "--disable-radix-cache: a hybrid's request then holds one state slot, "
                        "not five); by default shared prompt prefixes prefill less (vLLM "
                        "serves hybrid models without it)")
    p.add_argument("--tokenizer", metavar="PATH",
                   help="a Hugging Face tokenizer.json to count and generate tokens with, so "
                        "that prompt counts equal a client's using the same file (needs the "
                        "'tokenizer' extra; default: the simulator's built-in tokenizer)")
    p.add_argument("--admit-window-ms", type=float, default=0.0,
                   help="an idle engine gathers the requests that arrive within this many wall "
                        "ms of the first into one prefill, timed from the first one's arrival: "
                        "a burst sent at once is prefilled together whatever order the HTTP "
                        "layer hands it over in, and the window adds no time while it is "
                        "shorter than the scaled prefill (default 0)")
    p.set_defaults(handler=run)


def config_of(args: argparse.Namespace):
    """The ``engine_advisor.sim.config.SimConfig`` of parsed ``sim`` arguments."""
    from engine_advisor.sim.config import SimConfig

    return SimConfig(engine=args.engine, host=args.host, port=args.port,
                     model_name=args.model_name, gpu=args.gpu, num_gpus=args.num_gpus,
                     dcp_size=args.dcp_size, mem_fraction=args.mem_fraction,
                     kv_bytes_per_token=args.kv_bytes_per_token, kv_shards=args.kv_shards,
                     weight_bytes=args.weight_bytes, model_artifact=args.model,
                     time_scale=args.time_scale, max_running=args.max_running,
                     max_mamba_cache_size=args.max_mamba_cache_size,
                     mamba_full_memory_ratio=args.mamba_full_memory_ratio,
                     max_model_len=args.max_model_len, fail_rate=args.fail_rate,
                     startup_seconds=args.startup_seconds, seed=args.seed,
                     oom_threshold=args.oom_threshold, oom_rate=args.oom_rate,
                     oom_on_startup=args.oom_on_startup,
                     disable_prefix_caching=args.disable_prefix_caching,
                     tokenizer=args.tokenizer, admit_window_ms=args.admit_window_ms,
                     custom_gpu=args.gpu_spec.model_dump() if args.gpu_spec else None)


def run(args: argparse.Namespace) -> int:
    cfg = config_of(args)
    problems = cfg.problems()
    if problems:
        print(f"engine-advisor: error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    if args.model:
        from engine_advisor.model.fit.artifact import ArtifactError, load
        try:
            model = load(args.model)[0]
        except ArtifactError as exc:
            print(f"engine-advisor: error: --model: {exc}", file=sys.stderr)
            return 2
    else:
        from engine_advisor.model.fit.default import default_model
        model = default_model()
    from engine_advisor.sim import tokenizer
    try:
        tok = tokenizer.load(cfg.tokenizer)
        from engine_advisor.sim.textgen import Vocab
        Vocab(tok)
    except (tokenizer.TokenError, ValueError) as exc:
        print(f"engine-advisor: error: --tokenizer: {exc}", file=sys.stderr)
        return 2
    from engine_advisor.sim.server import serve
    return serve(cfg, model, tok)
