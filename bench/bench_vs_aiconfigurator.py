"""Our default model side by side with aiconfigurator's static estimates.

Usage: .venv/bin/python bench/bench_vs_aiconfigurator.py
           [--csv bench/data/aiconfigurator_estimates.csv] [--write-docs docs/validation.md]

For every point of the CSV (written by bench/aiconfigurator_runs.py) the default model predicts
the same workload through the public contract (Workload -> recommend, dcp 1, extrapolation
allowed) and the script prints, per model x GPU x engine and overall, the median, 10th and
90th percentile of our / aiconfigurator ratios of TPOT and of the batch prefill time (our
``prefill_s`` against aiconfigurator's static-mode TTFT, which prefills the whole batch at once).
aiconfigurator flags a point out of memory when its static run (the whole batch prefilled at
once, activations included) would not fit; its latencies are still computed, and the comparison
keeps those points unless ``--exclude-oom`` is given. Points whose preset or GPU the model does
not know are counted as left out. ``--write-docs`` replaces the table between the
``<!-- aic-table:start -->`` / ``<!-- aic-table:end -->`` markers of the given page.
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

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
KV_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8"}
START, END = "<!-- aic-table:start -->", "<!-- aic-table:end -->"


def our_prediction(model, row: dict):
    """(tpot_ms, batch prefill ms) of the default model for one aiconfigurator point."""
    w = Workload(preset=row["model"], gpu=row["gpu"], num_gpus=int(row["tp"]),
                 context_tokens=int(row["context_tokens"]),
                 output_tokens=int(row["output_tokens"]), batch_size=int(row["batch"]),
                 engines=[row["engine"]], dcp_sizes=[1],
                 kv_cache_dtype=KV_DTYPES.get(row["kvcache_quant"], "bf16"),
                 allow_extrapolation=True)
    p = recommend(model, w, model.version).predictions[0]
    return p.tpot_s * 1e3, p.prefill_s * 1e3


def compare(rows: list[dict], exclude_oom: bool = False) -> tuple[dict, dict]:
    """Ratios grouped by (model, gpu, engine), and counts of points left out."""
    model = default_model()
    groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    left_out = {"aiconfigurator out of memory": 0}
    for row in rows:
        if exclude_oom and row["oom"] == "1":
            left_out["aiconfigurator out of memory"] += 1
            continue
        try:
            tpot, prefill = our_prediction(model, row)
        except ValidationError as exc:
            column = {"preset": "model", "gpu": "gpu"}
            key = "; ".join(sorted({f"{e['loc'][0]} {row[column[e['loc'][0]]]} unknown"
                                    if e["loc"] and e["loc"][0] in column else e["msg"]
                                    for e in exc.errors()}))
            left_out[key] = left_out.get(key, 0) + 1
            continue
        groups[(row["model"], row["gpu"], row["engine"])].append(
            (tpot / float(row["tpot_ms"]), prefill / float(row["ttft_ms"])))
    return groups, left_out


def _stats(pairs: list[tuple[float, float]]) -> str:
    a = np.array(pairs)
    t, p = a[:, 0], a[:, 1]
    return " | ".join([str(len(a))] + [f"{f(x):.2f}" for x in (t, p) for f in (
        np.median, lambda v: np.percentile(v, 10), lambda v: np.percentile(v, 90))])


def markdown(groups: dict, left_out: dict, meta: dict, note: str = "") -> str:
    lines = ["| model | GPU | engine | points | TPOT ours/aic median | p10 | p90 | "
             "prefill ours/aic median | p10 | p90 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (model, gpu, engine), pairs in sorted(groups.items()):
        lines.append(f"| {model} | {gpu} | {engine} | {_stats(pairs)} |")
    everything = [x for pairs in groups.values() for x in pairs]
    if everything:
        lines.append(f"| **all** | | | {_stats(everything)} |")
        a = np.array(everything)
        within = np.mean((a > 1 / 1.5) & (a < 1.5), axis=0)
        lines.append("")
        lines.append(f"Within 1.5x of aiconfigurator: TPOT {within[0]:.0%}, "
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


def write_docs(page: Path, table: str) -> None:
    text = page.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{page}: no {START} ... {END} block to replace")
    page.write_text(pattern.sub(lambda _: f"{START}\n{table}\n{END}", text))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", type=Path, default=ROOT / "bench/data/aiconfigurator_estimates.csv")
    ap.add_argument("--write-docs", type=Path, default=None)
    ap.add_argument("--exclude-oom", action="store_true",
                    help="leave out points aiconfigurator flags out of memory")
    args = ap.parse_args(argv)
    with args.csv.open(newline="") as f:
        rows = list(csv.DictReader(f))
    meta_path = args.csv.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    groups, left_out = compare(rows, args.exclude_oom)
    oom = sum(r["oom"] == "1" for r in rows)
    note = (f"{oom} of the {len(rows)} points are ones aiconfigurator flags out of memory for its "
            "whole-batch static prefill; their latencies are included."
            if oom and not args.exclude_oom else "")
    table = markdown(groups, left_out, meta, note)
    print(table)
    if args.write_docs:
        write_docs(args.write_docs, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
