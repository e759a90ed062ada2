"""Run NVIDIA aiconfigurator's static estimate over a grid and write its TPOT / prefill per point.

This script runs inside aiconfigurator's own virtual environment (it is not a dependency of
engine-advisor), e.g.::

    python3 -m venv /tmp/aic && /tmp/aic/bin/pip install aiconfigurator==0.12.0
    HF_HUB_OFFLINE=1 /tmp/aic/bin/python bench/aiconfigurator_runs.py --log /tmp/aic-runs.log

Each point is what ``aiconfigurator cli estimate --estimate-mode static --model-path M --system S
--backend E --isl C --osl O --batch-size B --tp T`` prints; the script calls the function that
command calls (``aiconfigurator.cli.api.cli_estimate``) in one process, because a fresh process
spends most of its ~40 s loading the performance database.  Static mode prefills the whole batch
at once (``ttft_ms`` is the batch prefill time) and then decodes it without in-flight batching
(``tpot_ms`` is the mean step time over the ``osl`` output tokens).

Rows are appended as points finish, so an interrupted run resumes where it stopped; a sidecar
``<csv>.json`` records the aiconfigurator version, the date and the command.

Two grids: by default ``--per-combo`` (context, batch) cells per model x GPU x engine, in
rotation, at the smallest TP that fits (``bench/data/aiconfigurator_estimates.csv``, vLLM and
SGLang). ``--tp 8`` instead runs every cell of ``--contexts`` x ``--batches`` at that TP, the
grid of the TensorRT-LLM comparison (issue 46)::

    HF_HUB_OFFLINE=1 /tmp/aic/bin/python bench/aiconfigurator_runs.py --engines trtllm \
        --tp 8 --contexts 8192,32768,131072 --batches 1,16,64 \
        --systems h200_sxm,b200_sxm,b300_sxm --models llama-3.1-70b,... \
        --out bench/data/aiconfigurator_trtllm_estimates.csv --log /tmp/aic-trtllm.log

A MoE runs with MoE TP = TP and no expert parallelism where aiconfigurator has that layout's
measured MoE table for the engine; where it has not (its TensorRT-LLM tables lack Nemotron-3
Nano's MoE at MoE TP 8), the next layout with the same GPUs (MoE TP / 2, EP x 2, ...) that it
has, recorded in the ``moe_tp`` / ``moe_ep`` columns.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# engine-advisor preset -> the Hugging Face id whose config.json ships with aiconfigurator-core
MODELS: dict[str, str] = {
    "llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B",
    "llama-3.1-405b": "meta-llama/Meta-Llama-3.1-405B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "kimi-k2": "moonshotai/Kimi-K2-Instruct",
    "kimi-k3": "moonshotai/Kimi-K3",
    "nemotron-3-nano-30b-a3b": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
}
# the default grid's models (bench/data/aiconfigurator_estimates.csv); the others by --models
DEFAULT_MODELS = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-32b",
                  "qwen3-235b-a22b", "deepseek-v3", "kimi-k2", "kimi-k3")
# run with MoE TP = TP, no EP (where aiconfigurator can)
MOE = {"qwen3-235b-a22b", "deepseek-v3", "kimi-k2", "kimi-k3",
       "nemotron-3-nano-30b-a3b", "qwen3-30b-a3b", "mixtral-8x7b"}
# approximate weight bytes (GB) of those checkpoints and KV bytes per token (bf16, all layers)
# with the number of KV heads TP can shard (1 for MLA), only to choose TP and feasible cells
WEIGHTS_GB = {"llama-3.1-8b": 16, "llama-3.1-70b": 141, "llama-3.1-405b": 811, "qwen3-32b": 66,
              "qwen3-235b-a22b": 470, "deepseek-v3": 690, "kimi-k2": 1030, "kimi-k3": 1450,
              "nemotron-3-nano-30b-a3b": 63, "qwen3-30b-a3b": 61, "mixtral-8x7b": 93}
KV_PER_TOKEN = {"llama-3.1-8b": (131_072, 8), "llama-3.1-70b": (327_680, 8),
                "llama-3.1-405b": (516_096, 8), "qwen3-32b": (262_144, 8),
                "qwen3-235b-a22b": (192_512, 4), "deepseek-v3": (70_272, 1),
                "kimi-k2": (70_272, 1), "kimi-k3": (27_648, 1),
                "nemotron-3-nano-30b-a3b": (6_144, 2),  # 6 attention layers of 52
                "qwen3-30b-a3b": (98_304, 4), "mixtral-8x7b": (131_072, 8)}
# aiconfigurator system name -> (engine-advisor GPU name, memory GB)
GPUS: dict[str, tuple[str, float]] = {
    "h100_sxm": ("H100", 80), "h200_sxm": ("H200", 141),
    "b200_sxm": ("B200", 180), "b300_sxm": ("B300", 288),
}
ENGINES = ("vllm", "sglang")  # the default grid's; --engines trtllm for TensorRT-LLM
CONTEXTS = (2048, 8192, 32768, 131072)
BATCHES = (1, 8, 32, 128)
OUTPUT_TOKENS = 256
MEMORY_SHARE = 0.85  # weights + KV may take at most this share of each GPU

FIELDS = ["model", "hf_model", "gpu", "system", "engine", "engine_version", "tp",
          "context_tokens", "output_tokens", "batch", "tpot_ms", "ttft_ms", "request_latency_ms",
          "tokens_per_s", "memory_gb_per_gpu", "gemm_quant", "moe_quant", "kvcache_quant",
          "oom", "warning", "moe_tp", "moe_ep"]


def smallest_tp(model: str, memory_gb: float, ctx: int, batch: int) -> int | None:
    """Smallest TP of 1, 2, 4, 8 at which weights and the batch's KV fit in MEMORY_SHARE of each
    GPU (KV sharded over at most as many ranks as the model has KV heads); None if TP 8 does not."""
    per_token, heads = KV_PER_TOKEN[model]
    for tp in (1, 2, 4, 8):
        kv_gb = batch * (ctx + OUTPUT_TOKENS) * per_token / min(tp, heads) / 1e9
        if WEIGHTS_GB[model] / tp + kv_gb <= MEMORY_SHARE * memory_gb:
            return tp
    return None


def full_grid(models: list[str], systems: list[str], engines: list[str], contexts: list[int],
              batches: list[int]) -> list[tuple[str, str, str, int, int]]:
    """Every model x GPU x engine x context x batch (the fixed-TP grid: nothing passed over;
    aiconfigurator's out-of-memory flag says which cells would not fit)."""
    return [(m, s, e, c, b) for m in models for s in systems for e in engines
            for c in contexts for b in batches]


def grid_points(models: list[str], systems: list[str], engines: list[str],
                per_combo: int) -> list[tuple[str, str, str, int, int]]:
    """``per_combo`` feasible (context, batch) cells for each model x GPU x engine, rotating
    through the 4 x 4 cell grid so the cells are covered about equally often; a cell whose
    weights and KV do not fit even at TP 8 is passed over for the next one."""
    cells = [(c, b) for c in CONTEXTS for b in BATCHES]
    stride = 5  # coprime with 16: one combination's cells spread over contexts and batches
    points, k = [], 0
    for model in models:
        for system in systems:
            for engine in engines:
                taken = 0
                for _ in range(len(cells)):
                    ctx, batch = cells[(k * stride) % len(cells)]
                    k += 1
                    if smallest_tp(model, GPUS[system][1], ctx, batch) is not None:
                        points.append((model, system, engine, ctx, batch))
                        taken += 1
                        if taken == per_combo:
                            break
    return points


def model_path(hf_id: str, workdir: Path) -> str:
    """The id itself when aiconfigurator resolves it offline; else a directory holding the
    config.json that aiconfigurator-core ships for it (Kimi-K2-Instruct is shipped but not in
    its list of known ids)."""
    from importlib.resources import files

    from aiconfigurator_core.sdk.common import DefaultHFModels

    if hf_id in DefaultHFModels:
        return hf_id
    shipped = Path(str(files("aiconfigurator_core"))) / "model_configs" / (
        f"{hf_id.replace('/', '--')}_config.json")
    local = workdir / hf_id.replace("/", "--")
    local.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shipped, local / "config.json")
    return str(local)


def moe_layouts(tp: int) -> list[tuple[int, int]]:
    """(MoE TP, EP) over the same ``tp`` GPUs, from all-TP to all-EP."""
    layouts, ep = [], 1
    while ep <= tp:
        layouts.append((tp // ep, ep))
        ep *= 2
    return layouts


def estimate(cli_estimate, workdir: Path, model: str, system: str, engine: str, ctx: int,
             batch: int, fixed_tp: int | None = None) -> dict:
    gpu, memory = GPUS[system]
    tp = fixed_tp or smallest_tp(model, memory, ctx, batch)
    path = model_path(MODELS[model], workdir)
    layouts = moe_layouts(tp) if model in MOE else [(0, 0)]
    for i, (moe_tp, moe_ep) in enumerate(layouts):
        moe = {"moe_tp_size": moe_tp, "moe_ep_size": moe_ep} if moe_tp else {}
        try:
            r = cli_estimate(path, system, mode="static", backend_name=engine, isl=ctx,
                             osl=OUTPUT_TOKENS, batch_size=batch, tp_size=tp, **moe)
            break
        except Exception as exc:  # no measured MoE table for this layout: try the next one
            if "MoE data missing" not in str(exc) or i == len(layouts) - 1:
                raise
    raw = r.raw or {}
    warning = (r.kv_cache_warning or "").replace("\n", " ").replace(path, MODELS[model])
    return {
        "model": model, "hf_model": MODELS[model], "gpu": gpu, "system": system,
        "engine": engine, "engine_version": r.backend_version, "tp": tp,
        "context_tokens": ctx, "output_tokens": OUTPUT_TOKENS, "batch": batch,
        "tpot_ms": round(float(r.tpot), 4), "ttft_ms": round(float(r.ttft), 3),
        "request_latency_ms": round(float(raw.get("request_latency", 0.0)), 3),
        "tokens_per_s": round(float(raw.get("tokens/s", 0.0)), 2),
        "memory_gb_per_gpu": round(float(raw.get("memory", 0.0)), 2),
        "gemm_quant": raw.get("gemm", ""), "moe_quant": raw.get("moe", ""),
        "kvcache_quant": raw.get("kvcache", ""),
        "oom": int(warning.startswith("OOM")), "warning": warning[:200],
        "moe_tp": moe_tp or "", "moe_ep": moe_ep or "",
    }


def done_keys(path: Path) -> set[tuple]:
    if not path.exists():
        return set()
    with path.open() as f:
        return {(r["model"], r["system"], r["engine"], int(r["context_tokens"]), int(r["batch"]))
                for r in csv.DictReader(f)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench/data/aiconfigurator_estimates.csv"))
    ap.add_argument("--log", type=Path, default=None, help="progress log (default: stderr)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--systems", default=",".join(GPUS))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--per-combo", type=int, default=2,
                    help="(context, batch) cells per model x GPU x engine")
    ap.add_argument("--tp", type=int, default=None,
                    help="run every --contexts x --batches cell at this TP (default: the "
                         "rotating grid at the smallest TP that fits)")
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("--budget-s", type=float, default=1200.0,
                    help="stop starting new points after this many seconds")
    args = ap.parse_args(argv)

    logging.basicConfig(filename=args.log, level=logging.INFO,
                        format="%(asctime)s %(message)s")
    log = logging.getLogger("aic-runs")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for noisy in ("aiconfigurator", "aiconfigurator_core"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    from importlib.metadata import version

    from aiconfigurator.cli.api import cli_estimate

    workdir = Path(tempfile.mkdtemp(prefix="aic-configs-"))
    models, systems, engines = (args.models.split(","), args.systems.split(","),
                                args.engines.split(","))
    if args.tp:
        points = full_grid(models, systems, engines,
                           [int(c) for c in args.contexts.split(",")],
                           [int(b) for b in args.batches.split(",")])
    else:
        points = grid_points(models, systems, engines, args.per_combo)
    seen = done_keys(args.out)
    todo = [p for p in points if p not in seen]
    log.info("%d points, %d already in %s, %d to run", len(points), len(seen), args.out, len(todo))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    new_file = not args.out.exists()
    header = FIELDS
    if not new_file:  # resume with the file's own columns (older files lack moe_tp / moe_ep)
        with args.out.open(newline="") as f:
            header = next(csv.reader(f), FIELDS)
    start = time.monotonic()
    failed = 0
    with args.out.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header, extrasaction="ignore")
        if new_file:
            w.writeheader()
        for i, (model, system, engine, ctx, batch) in enumerate(todo, 1):
            if time.monotonic() - start > args.budget_s:
                log.info("budget of %.0f s spent; %d points left", args.budget_s, len(todo) - i + 1)
                break
            t0 = time.monotonic()
            try:
                row = estimate(cli_estimate, workdir, model, system, engine, ctx, batch,
                               args.tp)
            except Exception as exc:  # aiconfigurator refuses some combinations; log and go on
                failed += 1
                log.info("[%d/%d] %s %s %s ctx=%d bs=%d FAILED: %s", i, len(todo), model, system,
                         engine, ctx, batch, str(exc).splitlines()[0][:200] if str(exc) else exc)
                continue
            w.writerow(row)
            f.flush()
            log.info("[%d/%d] %s %s %s ctx=%d bs=%d tp=%d tpot=%.3f ms ttft=%.1f ms (%.1f s)",
                     i, len(todo), model, system, engine, ctx, batch, row["tp"], row["tpot_ms"],
                     row["ttft_ms"], time.monotonic() - t0)
    meta = {
        "tool": "aiconfigurator", "version": version("aiconfigurator"),
        "core_version": version("aiconfigurator-core"),
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "command": "HF_HUB_OFFLINE=1 python bench/aiconfigurator_runs.py " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "equivalent_cli": "aiconfigurator cli estimate --estimate-mode static --model-path "
                          "<hf_model> --system <system> --backend <engine> --isl <context_tokens> "
                          f"--osl {OUTPUT_TOKENS} --batch-size <batch> --tp <tp>"
                          + (" --moe-tp-size <moe_tp> --moe-ep-size <moe_ep>" if args.tp else ""),
        "database_mode": "SILICON (default)", "perf_db_version": "current (default)",
        "points_in_grid": len(points), "rows_in_csv": len(done_keys(args.out)),
        "failed_points": failed, "wall_s": round(time.monotonic() - start, 1),
    }
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    log.info("done: %s", meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
