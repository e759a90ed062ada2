#!/usr/bin/env python3
"""The DCP runs of issue 27, per DCP size: decode step vs context, KV capacity, where DCP pays.

    python bench/real_engines/dcp_report.py RUNS_DIR [--plot docs/img/dcp-real.png]

RUNS_DIR holds the run folders ``bench/real_engines/run.py all --tp N`` writes
(``<engine>-deepseek-v2-lite-tpN-dcpD/ctx<C>/``). The script fits the default model's data plus
these rows (``engine_advisor.model.fit.fitting``: DCP terms move only on DCP rows) and prints, per
engine and DCP size, each point's measured decode step next to the uncalibrated prior's and the
held-out fit's, the KV capacity the engine logged next to the predicted one, and the smallest
context at which each DCP size beats DCP 1 per batch size (measured where both ran, else the fit).
The published DCP figures of model/data/published.csv are compared in tests/model/test_published.py.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from engine_advisor.calibration.fit.fitter import read_all  # noqa: E402
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.dataset import read_csv  # noqa: E402
from engine_advisor.model.fit.default import REFERENCE_CSV, real_rows  # noqa: E402
from engine_advisor.model.fit.estimator import PRIOR, prior_vector  # noqa: E402
from engine_advisor.model.fit.rows import row_case, trainable  # noqa: E402
from engine_advisor.model.physics.features import case_features


def dcp_rows(runs: Path):
    folders = sorted(p for p in runs.glob("*-tp*-dcp*/ctx*") if (p / "dataset.csv").exists())
    if not folders:
        raise SystemExit(f"{runs}: no <engine>-<preset>-tpN-dcpD/ctx*/dataset.csv folders")
    rows, _ = read_all([str(f) for f in folders])
    return [r for r in rows if trainable(r)]


def step_table(model: CostModel, rows) -> list[dict]:
    prior = prior_vector(PRIOR)
    held = {(h["engine"], h["gpu"], h["dcp_size"], h["context_tokens"], h["batch_size"]): h
            for h in model.held_out if h["quantity"] == "step"}
    out = []
    for r in sorted(rows, key=lambda r: (r.engine, r.dcp_size, r.context_tokens, r.batch_size)):
        if r.decode_step_s is None:
            continue
        h = held.get((r.engine, r.gpu, r.dcp_size, r.context_tokens, r.batch_size))
        f = case_features(row_case(r))
        out.append({"engine": r.engine, "dcp": r.dcp_size, "context": r.context_tokens,
                    "batch": r.batch_size, "measured_ms": r.decode_step_s * 1e3,
                    "prior_ms": float(f.tpot[0] @ prior) * 1e3,
                    "fit_ms": h["held_out"] * 1e3 if h else None,
                    "capacity_logged": r.kv_capacity_tokens,
                    "capacity_predicted": int(f.capacity[0])})
    return out


def payoff(table: list[dict]) -> list[dict]:
    """Per engine, DCP size > 1 and batch: the smallest measured context where its decode step
    beats DCP 1's at the same point."""
    by = defaultdict(dict)
    for t in table:
        by[(t["engine"], t["batch"], t["context"])][t["dcp"]] = t["measured_ms"]
    out = []
    for (engine, batch, ctx), steps in sorted(by.items()):
        for d, ms in steps.items():
            if d > 1 and 1 in steps and ms < steps[1]:
                out.append({"engine": engine, "dcp": d, "batch": batch, "context": ctx,
                            "speedup": steps[1] / ms})
    first = {}
    for p in out:
        first.setdefault((p["engine"], p["dcp"], p["batch"]), p)
    return list(first.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args()
    rows = dcp_rows(a.runs)
    model = CostModel.fit(read_csv(REFERENCE_CSV) + real_rows() + rows)
    table = step_table(model, rows)
    print("| engine | DCP | context | batch | step measured (ms) | prior | fit, held out | "
          "KV logged | KV predicted |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in table:
        fit = f"{t['fit_ms']:.2f}" if t["fit_ms"] is not None else "n/a"
        print(f"| {t['engine']} | {t['dcp']} | {t['context']:,} | {t['batch']} | "
              f"{t['measured_ms']:.2f} | {t['prior_ms']:.2f} | {fit} | "
              f"{t['capacity_logged'] or 'n/a'} | {t['capacity_predicted']:,} |")
    print("\nWhere DCP first pays (measured decode step below DCP 1's):")
    for p in payoff(table):
        print(f"- {p['engine']} DCP {p['dcp']}, batch {p['batch']}: from {p['context']:,} "
              f"tokens ({p['speedup']:.2f}x)")
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), squeeze=False)
        for ax, engine in zip(axes[0], ("vllm", "sglang"), strict=True):
            for d in sorted({t["dcp"] for t in table}):
                sel = [t for t in table if t["engine"] == engine and t["dcp"] == d
                       and t["batch"] == max(x["batch"] for x in table)]
                if sel:
                    x = np.array([t["context"] for t in sel])
                    ax.plot(x, [t["measured_ms"] for t in sel], "o-", label=f"DCP {d} measured")
                    ax.plot(x, [t["prior_ms"] for t in sel], "x:", color="0.5")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{engine}: decode step at the largest batch (prior: x)", fontsize=9)
            ax.set_xlabel("context tokens")
            ax.set_ylabel("ms")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)
        print(f"\nwrote {a.plot}")


if __name__ == "__main__":
    main()
