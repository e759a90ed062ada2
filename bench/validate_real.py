#!/usr/bin/env python3
"""Prior vs calibrated vs measured on the shipped real-engine data (H200, vLLM 0.26.0, SGLang
0.5.16): the tables of docs/validation.md and the plot docs/img/real-h200.png.

    python bench/validate_real.py [--plot docs/img/real-h200.png]

Every calibrated figure is held out (engine_advisor.model.validation): each point is predicted by a
fit that did not see it. Runs on the CPU in a few seconds.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_advisor.model.fit.default import LEFT_OUT, default_model, left_out_rows, real_rows  # noqa: E402
from engine_advisor.model.validation import (  # noqa: E402
    NAMES,
    leave_model_out,
    markdown,
    summary,
    unseen_markdown,
)


def plot(s: dict, model, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4))
    colours = {"vllm": "tab:blue", "sglang": "tab:orange"}   # calibrated points by engine
    for ax, qty in zip(axes[:2], ("total", "step"), strict=True):
        for r in model.held_out:
            if r["gpu"] != "H200" or r["quantity"] != qty:
                continue
            c = colours[r["engine"]]
            ax.scatter(r["measured"], r["prior"], marker="x", color="0.6", s=18)
            ax.scatter(r["measured"], r["held_out"], marker="o", color=c, s=18)
        lo, hi = ax.get_xlim()
        ax.plot([lo, hi], [lo, hi], color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {NAMES[qty]} (s)")
        ax.set_ylabel("predicted (s)")
        ax.set_title(f"{NAMES[qty]}: prior (x), calibrated held out (o)", fontsize=9)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax = axes[2]
    for p in s["pairs"]:
        m = p["sglang"] / p["vllm"]
        ax.scatter(m, p["sglang_prior"] / p["vllm_prior"], marker="x", color="0.6", s=18)
        ax.scatter(m, p["sglang_pred"] / p["vllm_pred"], marker="o",
                   color="tab:green" if p["model"] == "deepseek-v2-lite" else "tab:purple", s=18)
    ax.plot([0.8, 2.0], [0.8, 2.0], color="k", lw=0.8)
    ax.set_xlabel("measured SGLang / vLLM total")
    ax.set_ylabel("predicted")
    ax.set_title("SGLang / vLLM: deepseek-v2-lite (green), llama (purple)", fontsize=9)
    fig.suptitle("Real vLLM 0.26.0 and SGLang 0.5.16 on one H200 (2026-12-01, random weights); "
                 "python bench/validate_real.py", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plot", type=Path, help="write the plot here (PNG)")
    a = ap.parse_args()
    model = default_model()
    s = summary(model, real_rows())
    print(markdown(s))
    # each model left out: the prior and a fit on the others against its runs
    for name in LEFT_OUT:
        print("\n" + unseen_markdown(leave_model_out(left_out_rows(name), name)))
    if a.plot:
        plot(s, model, a.plot)
        print(f"\nwrote {a.plot}")


if __name__ == "__main__":
    main()
