"""Our default model side by side with aiconfigurator's static estimates.

Usage: .venv/bin/python bench/bench_vs_aiconfigurator.py
           [--csv bench/data/aiconfigurator_estimates.csv] [--write-docs docs/validation.md]
           [--acceptance] [--markers aic-table]

For every point of the CSV (written by bench/aiconfigurator_runs.py) the default model predicts
the same workload through the public contract (Workload -> recommend, dcp 1, extrapolation
allowed) and the script prints, per model x GPU x engine and overall, the median, 10th and
90th percentile of our / aiconfigurator ratios of TPOT and of the batch prefill time (our
``prefill_s`` against aiconfigurator's static-mode TTFT, which prefills the whole batch at once).
aiconfigurator flags a point out of memory when its static run (the whole batch prefilled at
once, activations included) would not fit; its latencies are still computed, and the comparison
keeps those points unless ``--exclude-oom`` is given. Points whose preset or GPU the model does
not know are counted as left out. ``--write-docs`` replaces the table between the
``<!-- aic-table:start -->`` / ``<!-- aic-table:end -->`` markers of the given page
(``--markers NAME``: ``<!-- NAME:start -->`` ...).

``--acceptance`` holds the comparison to issue 46's targets (the TensorRT-LLM grid,
``bench/data/aiconfigurator_trtllm_estimates.csv``): per GPU and overall, the median ratio
(target: within 1.5x) and the share of points within 2x (target: 80 %) of TPOT and of the batch
prefill. A point whose batch does not fit the model's KV cache at once (the model then decodes
the sequences that fit, aiconfigurator's static mode all of them) has no comparable TPOT: it is
counted as left out of the TPOT column, its prefill kept. Points the model finds no
configuration for (weights and one sequence do not fit) are left out and counted.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from engine_advisor.model.errors import NoEligibleConfiguration
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
KV_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8"}
START, END = "<!-- aic-table:start -->", "<!-- aic-table:end -->"
TARGET_MEDIAN, TARGET_WITHIN, TARGET_SHARE = 1.5, 2.0, 0.80   # issue 46's acceptance
BATCH_UNFIT = "batch does not fit the KV cache at once (TPOT only)"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def our_prediction(model, row: dict, running: bool = False):
    """(tpot_ms, batch prefill ms) of the default model for one aiconfigurator point; with
    ``running`` also the sequences the model runs at once."""
    w = Workload(preset=row["model"], gpu=row["gpu"], num_gpus=int(row["tp"]),
                 context_tokens=int(row["context_tokens"]),
                 output_tokens=int(row["output_tokens"]), batch_size=int(row["batch"]),
                 engines=[row["engine"]], dcp_sizes=[1],
                 kv_cache_dtype=KV_DTYPES.get(row["kvcache_quant"], "bf16"),
                 allow_extrapolation=True)
    p = recommend(model, w, model.version).predictions[0]
    if running:
        return p.tpot_s * 1e3, p.prefill_s * 1e3, p.running_sequences
    return p.tpot_s * 1e3, p.prefill_s * 1e3


def compare(rows: list[dict], exclude_oom: bool = False, fitting_tpot: bool = False,
            detail: list | None = None) -> tuple[dict, dict]:
    """Ratios grouped by (model, gpu, engine), and counts of points left out. With
    ``fitting_tpot`` a point whose batch the model cannot run at once has TPOT ratio NaN
    (counted under ``BATCH_UNFIT``); ``detail``, when given, receives (row, TPOT ratio, prefill
    ratio) of every point compared."""
    model = default_model()
    groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    left_out = {"aiconfigurator out of memory": 0}
    for row in rows:
        if exclude_oom and row["oom"] == "1":
            left_out["aiconfigurator out of memory"] += 1
            continue
        try:
            tpot, prefill, running = our_prediction(model, row, running=True)
        except NoEligibleConfiguration:
            key = f"does not fit {row['gpu']} x {row['tp']} (weights and one sequence)"
            left_out[key] = left_out.get(key, 0) + 1
            continue
        except ValidationError as exc:
            column = {"preset": "model", "gpu": "gpu"}
            key = "; ".join(sorted({f"{e['loc'][0]} {row[column[e['loc'][0]]]} unknown"
                                    if e["loc"] and e["loc"][0] in column else e["msg"]
                                    for e in exc.errors()}))
            left_out[key] = left_out.get(key, 0) + 1
            continue
        tpot_ratio = tpot / float(row["tpot_ms"])
        if fitting_tpot and running < int(row["batch"]):
            tpot_ratio = float("nan")
            left_out[BATCH_UNFIT] = left_out.get(BATCH_UNFIT, 0) + 1
        groups[(row["model"], row["gpu"], row["engine"])].append(
            (tpot_ratio, prefill / float(row["ttft_ms"])))
        if detail is not None:
            detail.append((row, tpot_ratio, prefill / float(row["ttft_ms"])))
    return groups, left_out


def past(detail: list, factor: float = TARGET_WITHIN) -> str:
    """The points where the model and aiconfigurator part by more than ``factor``."""
    lines = ["| model | GPU | context | batch | quantity | ours / aic | ours ms | aic ms |",
             "|---|---|---|---|---|---|---|---|"]
    for row, tpot, prefill in detail:
        for name, ratio, aic_ms in (("TPOT", tpot, float(row["tpot_ms"])),
                                    ("prefill", prefill, float(row["ttft_ms"]))):
            if ratio == ratio and not 1 / factor <= ratio <= factor:
                lines.append(f"| {row['model']} | {row['gpu']} | {int(row['context_tokens']):,} | "
                             f"{row['batch']} | {name} | {ratio:.2f} | {ratio * aic_ms:,.1f} | "
                             f"{aic_ms:,.1f} |")
    return "\n".join(lines) if len(lines) > 2 else f"No point parts by more than {factor:g}x."


def acceptance(groups: dict) -> dict[str, dict[str, float]]:
    """Per GPU and overall (``"all"``): points, median ratio and share within
    ``TARGET_WITHIN`` of TPOT (points with a comparable TPOT) and of the batch prefill."""
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (_, gpu, _), pairs in groups.items():
        by[gpu] += pairs
        by["all"] += pairs
    out = {}
    for key, pairs in by.items():
        a = np.array(pairs)
        t, p = a[:, 0][~np.isnan(a[:, 0])], a[:, 1]
        out[key] = {"tpot_points": len(t), "tpot_median": float(np.median(t)),
                    "tpot_within": float(np.mean((t > 1 / TARGET_WITHIN) & (t < TARGET_WITHIN))),
                    "prefill_points": len(p), "prefill_median": float(np.median(p)),
                    "prefill_within": float(np.mean((p > 1 / TARGET_WITHIN)
                                                    & (p < TARGET_WITHIN)))}
    return out


def holds(stats: dict[str, float]) -> bool:
    """Issue 46's targets for one group of ``acceptance``."""
    return all(1 / TARGET_MEDIAN <= stats[f"{q}_median"] <= TARGET_MEDIAN
               and stats[f"{q}_within"] >= TARGET_SHARE for q in ("tpot", "prefill"))


def acceptance_markdown(groups: dict) -> str:
    acc = acceptance(groups)
    lines = ["| GPU | TPOT points | TPOT ours/aic median | TPOT within 2x | prefill points | "
             "prefill ours/aic median | prefill within 2x | targets hold |",
             "|---|---|---|---|---|---|---|---|"]
    for key in sorted(acc, key=lambda k: (k == "all", k)):
        s = acc[key]
        name = "**all**" if key == "all" else key
        lines.append(f"| {name} | {s['tpot_points']} | {s['tpot_median']:.2f} | "
                     f"{s['tpot_within']:.0%} | {s['prefill_points']} | "
                     f"{s['prefill_median']:.2f} | {s['prefill_within']:.0%} | "
                     f"{'yes' if holds(s) else 'no'} |")
    return "\n".join(lines)


def _stats(pairs: list[tuple[float, float]]) -> str:
    a = np.array(pairs)
    t, p = a[:, 0][~np.isnan(a[:, 0])], a[:, 1]
    cells = [f"{f(x):.2f}" if len(x) else "-" for x in (t, p) for f in (
        np.median, lambda v: np.percentile(v, 10), lambda v: np.percentile(v, 90))]
    return " | ".join([str(len(a))] + cells)


def markdown(groups: dict, left_out: dict, meta: dict, note: str = "") -> str:
    lines = ["| model | GPU | engine | points | TPOT ours/aic median | p10 | p90 | "
             "prefill ours/aic median | p10 | p90 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (model, gpu, engine), pairs in sorted(groups.items()):
        lines.append(f"| {model} | {gpu} | {engine} | {_stats(pairs)} |")
    everything = [x for pairs in groups.values() for x in pairs]
    if everything:
        lines.append(f"| **all** | | | {_stats(everything)} |")
        a = np.array(everything)
        t = a[:, 0][~np.isnan(a[:, 0])]
        within = (np.mean((t > 1 / 1.5) & (t < 1.5)), np.mean((a[:, 1] > 1 / 1.5)
                                                              & (a[:, 1] < 1.5)))
        lines.append("")
        lines.append(f"Within 1.5x of aiconfigurator: TPOT {within[0]:.0%}, "
                     f"prefill {within[1]:.0%} of {len(a)} points."
                     if len(t) == len(a) else
                     f"Within 1.5x of aiconfigurator: TPOT {within[0]:.0%} of {len(t)}, "
                     f"prefill {within[1]:.0%} of {len(a)} points.")
    skipped = ", ".join(f"{k}: {v}" for k, v in left_out.items() if v)
    if skipped:
        lines.append(f"Left out: {skipped}.")
    if note:
        lines.append(note)
    if meta:
        lines.append(f"aiconfigurator {meta.get('version')} (static mode, run "
                     f"{meta.get('date_utc')} UTC); our side: the default model of this "
                     "checkout.")
    return "\n".join(lines)


def write_docs(page: Path, table: str, name: str = "aic-table") -> None:
    start, end = markers(name)
    text = page.read_text()
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{page}: no {start} ... {end} block to replace")
    page.write_text(pattern.sub(lambda _: f"{start}\n{table}\n{end}", text))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", type=Path, default=ROOT / "bench/data/aiconfigurator_estimates.csv")
    ap.add_argument("--write-docs", type=Path, default=None)
    ap.add_argument("--exclude-oom", action="store_true",
                    help="leave out points aiconfigurator flags out of memory")
    ap.add_argument("--acceptance", action="store_true",
                    help="TPOT only where the model runs the whole batch at once, and a per-GPU "
                         "table against issue 46's targets (median within 1.5x, 80 %% of "
                         "points within 2x)")
    ap.add_argument("--markers", default="aic-table",
                    help="the docs block to replace: <!-- NAME:start --> ... <!-- NAME:end -->")
    args = ap.parse_args(argv)
    with args.csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    meta_path = args.csv.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    detail: list = []
    groups, left_out = compare(rows, args.exclude_oom, fitting_tpot=args.acceptance,
                               detail=detail)
    oom = sum(r["oom"] == "1" for r in rows)
    note = (f"{oom} of the {len(rows)} points are ones aiconfigurator flags out of memory for its "
            "whole-batch static prefill; their latencies are included."
            if oom and not args.exclude_oom else "")
    table = markdown(groups, left_out, meta, note)
    if args.acceptance:
        table = (acceptance_markdown(groups) + "\n\n" + table
                 + "\n\nPoints past 2x (TPOT only where the batch fits at once):\n\n"
                 + past(detail))
    print(table)
    if args.write_docs:
        write_docs(args.write_docs, table, args.markers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
