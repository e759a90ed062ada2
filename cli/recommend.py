"""``engine-advisor recommend``: one workload -> the recommendation (table or --json)."""

from __future__ import annotations

import argparse
import re

from pydantic import ValidationError

from engine_advisor.cli.args import int_list
from engine_advisor.cli.catalogue import add_hardware_flags

FLAGS = {
    "context_tokens": "--context-tokens", "output_tokens": "--output-tokens",
    "batch_size": "--batch-size", "kv_bytes_per_token": "--kv-bytes-per-token",
    "hf_config": "--hf-config", "preset": "--preset", "kv_cache_dtype": "--kv-cache-dtype",
    "gpu": "--gpu", "num_gpus": "--num-gpus", "engines": "--engines", "dcp_sizes": "--dcp-sizes",
    "model_weight_bytes": "--model-weight-bytes", "model": "--model-name",
    "requirements.prefix_reuse_share": "--prefix-reuse-share",
    "allow_extrapolation": "--allow-extrapolation",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("recommend", help="recommend engine, DCP size and memory fraction",
                       description="Recommend vLLM, SGLang or TensorRT-LLM, the DCP size and "
                                   "the memory fraction for one workload.")
    p.add_argument("--context-tokens", type=int, required=True, help="prompt tokens per sequence")
    p.add_argument("--output-tokens", type=int, required=True, help="output tokens per sequence")
    p.add_argument("--batch-size", type=int, default=1, help="concurrent sequences (default 1)")
    kv = p.add_mutually_exclusive_group(required=True)
    kv.add_argument("--kv-bytes-per-token", type=int, help="KV bytes per token, all layers")
    kv.add_argument("--hf-config", metavar="PATH", help="the model's config.json")
    kv.add_argument("--preset", help="a built-in model preset (e.g. kimi-k2, llama-3.1-70b)")
    p.add_argument("--kv-cache-dtype", default="bf16", help="bf16 (default), fp16 or fp8")
    add_hardware_flags(p)
    p.add_argument("--num-gpus", type=int, default=8,
                   help="GPUs = tensor-parallel size (default 8)")
    p.add_argument("--engines", type=lambda s: [x for x in s.split(",") if x],
                   help="restrict to these engines, e.g. vllm,sglang,trtllm")
    p.add_argument("--dcp-sizes", type=int_list, help="restrict DCP sizes, e.g. 1,2,4,8")
    p.add_argument("--model-weight-bytes", type=float, help="weight bytes (for KV capacity)")
    p.add_argument("--prefix-reuse-share", type=float,
                   help="share of each prompt found in the prefix cache, 0..1 (e.g. 0.99 when "
                        "every sequence shares one long prompt)")
    p.add_argument("--model-name", help="model name or path to put in the launch command")
    p.add_argument("--allow-extrapolation", action="store_true",
                   help="allow configurations without calibration data")
    p.add_argument("--model", metavar="ARTIFACT", help="fitted model artifact NAME.json (default: "
                                                       "embedded)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="print the recommendation object as JSON")
    out.add_argument("--emit", metavar="{k8s,compose}",
                     help="print deployment files instead: a Kubernetes Deployment + Service "
                          "(k8s) or a docker compose service (compose)")
    p.add_argument("--image", help="engine image repository for --emit (default "
                                   "vllm/vllm-openai or lmsysorg/sglang)")
    p.add_argument("--image-tag", help="engine image tag for --emit (default latest)")
    p.add_argument("--deploy-name", help="name of the Deployment / Service / compose service "
                                         "for --emit (default: engine and model name)")
    p.add_argument("--shm-gib", type=int, help="shared memory (/dev/shm) in GiB for --emit "
                                               "(default 16)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine_advisor.cli.common import load_model, read_json_file, validation_message
    from engine_advisor.cli.errors import CliError
    from engine_advisor.model.errors import NoEligibleConfiguration
    from engine_advisor.model.recommend import recommend
    from engine_advisor.model.workload import Workload

    data = {k: getattr(args, k) for k in FLAGS if k not in ("hf_config", "model")
            and "." not in k and getattr(args, k, None) is not None}
    if args.prefix_reuse_share is not None:
        data["requirements"] = {"prefix_reuse_share": args.prefix_reuse_share}
    if args.hf_config:
        data["hf_config"] = read_json_file(args.hf_config, "--hf-config")
    if args.model_name:
        data["model"] = args.model_name
    if args.gpu_spec is not None:
        data["gpu"] = args.gpu_spec
    data["allow_extrapolation"] = args.allow_extrapolation
    try:
        workload = Workload.model_validate(data)
    except ValidationError as exc:
        raise CliError(validation_message(exc, FLAGS).replace(
            "or give a custom spec", "or give a custom spec with --gpu-spec")) from None
    deploy = deploy_options(args)
    model = load_model(args.model)
    try:
        rec = recommend(model, workload, model.version)
    except NoEligibleConfiguration as exc:
        raise CliError(f"{FLAGS.get(exc.field, exc.field)}: {as_flags(str(exc))}") from None
    if deploy is not None:
        print(emit(rec, workload, deploy), end="")
    elif args.json:
        print(rec.model_dump_json(indent=2))
    else:
        print(format_table(rec))
    return 0


# the snake_case field names a message may name (not part of a flag or another word)
_FIELD = re.compile(r"(?<![-\w])(" + "|".join(k for k in FLAGS if "_" in k and "." not in k)
                    + r")(?![-\w])")


def as_flags(message: str) -> str:
    """A model message with the workload's field names written as this command's flags."""
    return _FIELD.sub(lambda m: FLAGS[m.group(1)], message)


# DeployOptions field -> (argparse dest, option)
DEPLOY_FLAGS = {"format": ("emit", "--emit"), "image": ("image", "--image"),
                "image_tag": ("image_tag", "--image-tag"),
                "name": ("deploy_name", "--deploy-name"), "shm_gib": ("shm_gib", "--shm-gib")}


def deploy_options(args: argparse.Namespace):
    """The --emit options, validated before the model loads; None without --emit."""
    from engine_advisor.cli.common import validation_message
    from engine_advisor.cli.errors import CliError
    from engine_advisor.model.presentation.deploy import DeployOptions

    given = {k: getattr(args, dest) for k, (dest, _) in DEPLOY_FLAGS.items()
             if getattr(args, dest) is not None}
    if args.emit is None:
        if given:
            raise CliError(f"{DEPLOY_FLAGS[next(iter(given))][1]}: only used with --emit")
        return None
    try:
        return DeployOptions.model_validate(given)
    except ValidationError as exc:
        flags = {k: flag for k, (_, flag) in DEPLOY_FLAGS.items()}
        raise CliError(validation_message(exc, flags)) from None


def emit(rec, workload, opts) -> str:
    from engine_advisor.cli.errors import CliError
    from engine_advisor.model.presentation.deploy import DeployError, render

    try:
        return render(rec, workload, opts)
    except DeployError as exc:
        raise CliError(str(exc)) from None


def format_table(rec) -> str:
    head = (f"{'engine':<8}{'dcp':>4}{'total s':>10}{'90% interval':>20}{'prefill s':>11}"
            f"{'TPOT ms':>9}{'mem':>6}{'KV cap tok':>13}  status")
    lines = [head, "-" * len(head)]
    for p in rec.predictions:
        mark = "*" if (p.engine, p.dcp_size) == (rec.engine, rec.dcp_size) else " "
        status = ("calibrated" if p.calibrated and not p.extrapolated else
                  "extrapolated" if p.calibrated else
                  "transferred" if p.transferred else "uncalibrated")
        if not p.fits_in_memory:
            status += ", KV over capacity"
        lo, hi = p.interval_s
        lines.append(f"{mark}{p.engine:<7}{p.dcp_size:>4}{p.total_s:>10.1f}"
                     f"{f'[{lo:.1f}, {hi:.1f}]':>20}{p.prefill_s:>11.1f}{p.tpot_s * 1e3:>9.1f}"
                     f"{p.mem_fraction:>6.2f}{p.kv_capacity_tokens:>13,}  {status}")
    speed = f", {rec.speedup:.2f}x" if rec.speedup else ""
    value = rec.mem_fraction if rec.mem_flag_value is None else rec.mem_flag_value
    of_gpu = (f" (= {rec.mem_fraction:.2f} of the GPU)"
              if abs(value - rec.mem_fraction) >= 0.005 else "")
    lines += ["", f"Recommendation: {rec.engine} dcp {rec.dcp_size}, {rec.mem_fraction_flag} "
              f"{value:.2f}{of_gpu}{speed} (confidence {rec.confidence})"]
    if rec.crossover_context_tokens:
        lines.append(f"Crossover: the best engine changes near {rec.crossover_context_tokens:,} "
                     "context tokens")
    lines += ["", "Why:"] + [f"  - {r}" for r in rec.reasons]
    if rec.excluded:
        lines += ["", "Excluded:"] + [f"  - {e.describe()}" for e in rec.excluded]
    lines += ["", "Launch:", "  " + " ".join(rec.launch_command)]
    if rec.config_file is not None:
        lines += ["", f"{rec.config_file.path}:"]
        lines += ["  " + line for line in rec.config_file.content.splitlines()]
    lines += ["", f"model {rec.model_version}"]
    return "\n".join(lines)
