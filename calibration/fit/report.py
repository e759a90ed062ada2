"""The fit report: cross-validated error per engine and DCP size, interval coverage, calibrated
ranges, crossovers, and plots (``fit --report DIR``).

The held-out predictions are the fit's own (``CostModel.held_out``,
``engine_advisor.model.fit.fitting``): each grid point (all its repeats and memory fractions
together, so a repeat cannot vouch for its twin) is predicted by the fit without it, for its total
time, the batch's prefill and one decode step, with its level's held-out 90 % interval, next to what
the uncalibrated prior predicts for it. MAPE is the mean absolute percentage error; coverage is the
share of held-out measurements inside their interval.
"""

from __future__ import annotations

import io
import json
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine_advisor.model.arch import PRESETS
from engine_advisor.model.decision.crossover import crossovers
from engine_advisor.model.diskio import atomic_write
from engine_advisor.model.errors import DiskError
from engine_advisor.model.fit.costmodel import (
    EXTRAPOLATION_REL_SIGMA,
    TRANSFERRED_REL_SIGMA,
    UNCALIBRATED_REL_SIGMA,
    CostModel,
    efficiency_key,
)
from engine_advisor.model.fit.dataset import Measurement
from engine_advisor.model.fit.rows import trainable
from engine_advisor.model.predict.predictor import predictor_for
from engine_advisor.model.predict.query import build_case, coverage
from engine_advisor.model.workload import Config, Workload

CURVE_POINTS = 96
QUANTITIES = ("total", "step", "ttft")


def config_label(engine: str, dcp: int) -> str:
    return f"{engine} dcp{dcp}"


def usable(rows: Sequence[Measurement]) -> list[Measurement]:
    """Rows the cost model trains on."""
    return [r for r in rows if trainable(r)]


def held_out_records(model: CostModel) -> list[dict[str, Any]]:
    """The fit's held-out predictions (``CostModel.held_out``) with their 90 % intervals."""
    out = []
    for rec in model.held_out:
        est = model.engines[efficiency_key(rec["engine"], rec["gpu"])]
        w = math.expm1(est.interval_halfwidth_ or 0.0)
        out.append({**rec, "predicted": rec["held_out"],
                    "lo": rec["held_out"] * max(1.0 - w, 0.0), "hi": rec["held_out"] * (1.0 + w)})
    return out


def summarise(cv: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per 'engine dcpN' (and per engine): MAPE of each quantity, the prior's on the same
    points, coverage, point count."""
    buckets: dict[str, list[dict[str, Any]]] = defaultdict(list)
    dcps: dict[str, set[int]] = defaultdict(set)
    for rec in cv:
        dcps[rec["engine"]].add(rec["dcp_size"])
    for rec in cv:
        buckets[config_label(rec["engine"], rec["dcp_size"])].append(rec)
        if len(dcps[rec["engine"]]) > 1:     # an engine-wide line only when it adds something
            buckets[f"{rec['engine']} (all DCP)"].append(rec)
    out = {}
    for key, recs in sorted(buckets.items()):
        s: dict[str, Any] = {"n_points": len({(r["context_tokens"], r["batch_size"],
                                                r["output_tokens"], r["dcp_size"]) for r in recs})}
        for q in QUANTITIES:
            errs = [abs(r["predicted"] - r["measured"]) / r["measured"] for r in recs
                    if r["quantity"] == q]
            prior = [abs(r["prior"] - r["measured"]) / r["measured"] for r in recs
                     if r["quantity"] == q and "prior" in r]
            s[f"cv_mape_{q}"] = float(np.mean(errs)) if errs else None
            s[f"cv_max_ape_{q}"] = float(np.max(errs)) if errs else None
            s[f"prior_mape_{q}"] = float(np.mean(prior)) if prior else None
        inside = [r["lo"] <= r["measured"] <= r["hi"] for r in recs]
        s["interval_coverage"] = float(np.mean(inside)) if inside else None
        s["n_observations"] = len(recs)
        out[key] = s
    return out


# ------------------------------------------------------------------------ curves & crossovers
def reference_workloads(rows: Sequence[Measurement]) -> list[dict[str, Any]]:
    """The most common (gpu, num_gpus, output, kv) of the data at its smallest, middle and
    largest measured batch size."""
    timed = usable(rows)
    if not timed:
        return []
    common = Counter((r.gpu, r.num_gpus, r.output_tokens, r.kv_bytes_per_token, r.model,
                      r.kv_cache_dtype) for r in timed)
    top, _ = common.most_common(1)[0]
    gpu, n, out, kv, name, dtype = top
    batches = sorted({r.batch_size for r in timed if (r.gpu, r.num_gpus, r.output_tokens,
                                                      r.kv_bytes_per_token, r.model,
                                                      r.kv_cache_dtype) == top})
    picked = sorted({batches[0], batches[len(batches) // 2], batches[-1]})
    served = ({"preset": name, "kv_cache_dtype": dtype} if name in PRESETS
              else {"kv_bytes_per_token": kv})
    return [{"gpu": gpu, "num_gpus": n, "output_tokens": out, **served, "batch_size": b}
            for b in picked]


def curves(model: CostModel, ref: dict[str, Any], contexts: np.ndarray) -> dict[str, Any]:
    """Predicted total (and 90 % interval) vs context for every calibrated configuration."""
    w = Workload(context_tokens=int(contexts[0]), **ref)
    layout = w.model_shape()
    configs = sorted({Config(k.split("/")[0], int(k.split("/")[3])) for k in model.ranges
                      if k.split("/")[1] == ref["gpu"] and int(k.split("/")[2]) == ref["num_gpus"]
                      and k.split("/")[0] in model.engine_names},
                     key=lambda c: (c.engine, c.dcp_size))
    if not configs:
        return {"configs": [], "contexts": contexts.tolist()}
    case = build_case(model, w, layout, configs, contexts)
    extra = []
    for c in configs:
        for ctx in contexts:
            status, dist = coverage(model, c.engine, ref["gpu"], ref["num_gpus"], c.dcp_size,
                                    layout.key, {"context_tokens": ctx,
                                                       "batch_size": ref["batch_size"],
                                                       "output_tokens": ref["output_tokens"]})
            extra.append({"calibrated": EXTRAPOLATION_REL_SIGMA * dist,
                          "transferred": TRANSFERRED_REL_SIGMA}.get(status,
                                                                   UNCALIBRATED_REL_SIGMA))
    p = predictor_for(model).predict(case, np.array(extra))
    m = len(contexts)
    shape = (len(configs), m)
    totals = p.total.reshape(shape)
    found = crossovers(contexts, totals) if len(configs) > 1 else []
    return {"configs": configs, "contexts": contexts, "total": totals,
            "lo": p.total_lo.reshape(shape), "hi": p.total_hi.reshape(shape),
            "crossovers": [{"context_tokens": x, "from": config_label(configs[a].engine,
                                                                        configs[a].dcp_size),
                            "to": config_label(configs[b].engine, configs[b].dcp_size)}
                           for x, a, b in found]}


def context_grid(rows: Sequence[Measurement]) -> np.ndarray:
    ctx = [r.context_tokens for r in usable(rows)]
    lo, hi = max(min(ctx) / 2, 256), max(ctx) * 2
    return np.geomspace(lo, hi, CURVE_POINTS)


# ------------------------------------------------------------------------ plots
def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _plain_log_ticks(ax, axes: str = "y") -> None:
    """Log axes labelled 0.1, 0.2, 0.5, 1, ... instead of powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    for name in axes:
        axis = ax.xaxis if name == "x" else ax.yaxis
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def _save_png(plt, fig, path: Path) -> None:
    """The figure as a PNG at ``path``, written atomically (``atomic_write``: a full disk leaves
    the old plot and no half file, and says so naming the path)."""
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=110)
    finally:
        plt.close(fig)
    atomic_write(path, buf.getvalue())


def plot_measured_vs_predicted(cv: list[dict[str, Any]], path: Path) -> None:
    plt = _plt()
    quantities = [q for q in QUANTITIES if any(r["quantity"] == q for r in cv)]
    fig, axes = plt.subplots(1, len(quantities), figsize=(5.2 * len(quantities), 4.8),
                             squeeze=False)
    labels = sorted({config_label(r["engine"], r["dcp_size"]) for r in cv})
    colors = {lab: plt.cm.tab10(i % 10) for i, lab in enumerate(labels)}
    titles = {"total": "total time of the batch (s)", "step": "decode step (ms)",
              "ttft": "batch prefill (s)"}
    for ax, q in zip(axes[0], quantities, strict=True):
        scale = 1e3 if q == "step" else 1.0
        recs = [r for r in cv if r["quantity"] == q]
        for lab in labels:
            sel = [r for r in recs if config_label(r["engine"], r["dcp_size"]) == lab]
            if not sel:
                continue
            x = np.array([r["measured"] for r in sel]) * scale
            y = np.array([r["predicted"] for r in sel]) * scale
            err = np.array([[r["predicted"] - r["lo"], r["hi"] - r["predicted"]]
                            for r in sel]).T * scale
            ax.errorbar(x, y, yerr=err, fmt="o", ms=5, capsize=2, alpha=0.8, color=colors[lab],
                        label=lab)
        vals = [r[k] * scale for r in recs for k in ("measured", "predicted")]
        lo, hi = min(vals) / 1.3, max(vals) * 1.3
        ax.plot([lo, hi], [lo, hi], "k-", lw=1, label="measured = predicted")
        ax.fill_between([lo, hi], [lo * 0.95, hi * 0.95], [lo * 1.05, hi * 1.05], color="grey",
                        alpha=0.15, label="±5 %")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain_log_ticks(ax, "xy")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"measured {titles[q]}")
        ax.set_ylabel(f"predicted (held out) {titles[q]}")
        ax.set_title(f"{q.upper()}: leave-one-point-out")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("Cross-validated predictions with 90 % intervals")
    fig.tight_layout()
    _save_png(plt, fig, path)


def plot_total_vs_context(model: CostModel, rows: Sequence[Measurement],
                          panels: list[tuple[dict[str, Any], dict[str, Any]]], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.8), squeeze=False)
    for ax, (ref, cur) in zip(axes[0], panels, strict=True):
        ctx = cur["contexts"]
        for i, c in enumerate(cur["configs"]):
            color = plt.cm.tab10(i % 10)
            lab = config_label(c.engine, c.dcp_size)
            ax.plot(ctx, cur["total"][i], color=color, lw=2, label=f"{lab} predicted")
            ax.fill_between(ctx, cur["lo"][i], cur["hi"][i], color=color, alpha=0.18)
            meas = [r for r in usable(rows) if r.engine == c.engine and r.dcp_size == c.dcp_size
                    and r.batch_size == ref["batch_size"] and r.total_s is not None
                    and r.output_tokens == ref["output_tokens"]
                    and r.kv_bytes_per_token == ref.get("kv_bytes_per_token",
                                                        r.kv_bytes_per_token)
                    and (r.model == ref["preset"] if "preset" in ref else True)]
            if meas:
                ax.plot([r.context_tokens for r in meas], [r.total_s for r in meas], "o",
                        color=color, mec="black", mew=0.6, ms=6, label=f"{lab} measured")
        for x in cur["crossovers"]:
            ax.axvline(x["context_tokens"], color="black", ls="--", lw=1)
            ax.annotate(f"crossover\n{x['context_tokens']:,} tokens",
                        xy=(x["context_tokens"], ax.get_ylim()[1]), xytext=(4, -28),
                        textcoords="offset points", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_log_ticks(ax)
        from matplotlib.ticker import FuncFormatter
        ax.xaxis.set_major_formatter(FuncFormatter(
            lambda v, _: f"{v / 1024:g}K" if v >= 1024 else f"{v:g}"))
        ax.set_xlabel("context tokens per sequence")
        ax.set_ylabel("predicted total time of the batch (s)")
        ax.set_title(f"batch {ref['batch_size']} x {ref['output_tokens']} output tokens, "
                     f"{ref['num_gpus']} x {ref['gpu']}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("Predicted total time vs context (shaded: 90 % interval)")
    fig.tight_layout()
    _save_png(plt, fig, path)


# ------------------------------------------------------------------------ the report
def build_report(model: CostModel, rows: Sequence[Measurement]) -> tuple[dict[str, Any], list]:
    points: dict[str, set] = {}
    for r in model.held_out:
        points.setdefault(r["engine"], set()).add((r["context_tokens"], r["batch_size"],
                                                   r["output_tokens"], r["dcp_size"]))
    # an engine with one point had nothing held out (its "held-out" prediction is the prior's)
    cv = [r for r in held_out_records(model) if len(points[r["engine"]]) > 1]
    summary = summarise(cv)
    refs = reference_workloads(rows)
    grid = context_grid(rows) if refs else np.array([])
    panels = [(ref, curves(model, ref, grid)) for ref in refs]
    report = {
        "model_version": model.version,
        "training_data_sha256": model.data_sha256,
        "sources": model.sources,
        "rows": len(rows),
        "rows_used": len(usable(rows)),
        "cross_validation": summary,
        "calibrated_ranges": model.ranges,
        "calibrated_points": model.points,
        "memory_fractions": model.memory,
        "coefficients": {e: est.coefficients_ for e, est in model.engines.items()},
        "residual_rel_std": {e: est.residual_rel_std_ for e, est in model.engines.items()},
        "free_terms": {e: list(est.free_) for e, est in model.engines.items()},
        "fit_metrics": model.metrics,
        "routing_diversity": model.diversity,
        "roofline_warnings": model.roofline_warnings,
        "crossovers": [{**x, **{k: ref[k] for k in ("batch_size", "output_tokens",
                                                    "kv_bytes_per_token", "preset", "gpu",
                                                    "num_gpus") if k in ref}}
                       for ref, cur in panels for x in cur["crossovers"]],
        "held_out": cv,
    }
    return report, panels


def write_report(model: CostModel, rows: Sequence[Measurement], folder: str | Path
                 ) -> dict[str, Any]:
    out = Path(folder)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DiskError.of(out, exc, "cannot create the report folder") from None
    report, panels = build_report(model, rows)
    plots = []
    if report["held_out"]:
        plot_measured_vs_predicted(report["held_out"], out / "measured_vs_predicted.png")
        plots.append("measured_vs_predicted.png")
    if panels and any(cur["configs"] for _, cur in panels):
        plot_total_vs_context(model, rows, panels, out / "total_vs_context.png")
        plots.append("total_vs_context.png")
    report["plots"] = plots
    atomic_write(out / "report.json", (json.dumps(report, indent=2, sort_keys=True,
                                                  default=_json_default) + "\n").encode())
    atomic_write(out / "report.md", markdown(report).encode())
    return {"markdown": str(out / "report.md"), "json": str(out / "report.json"),
            "plots": [str(out / p) for p in plots]}


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, np.floating | np.integer):
        return o.item()
    raise TypeError(type(o).__name__)


def _pct(v: float | None) -> str:
    return f"{v:.1%}" if v is not None else "n/a"


def markdown(report: dict[str, Any]) -> str:
    cv = report["cross_validation"]
    lines = [f"# Fit report: model {report['model_version']}", "",
             f"Training rows: {report['rows']} ({report['rows_used']} timed and without OOM), "
             f"data sha256 `{report['training_data_sha256'][:16]}`.", "",
             "Sources: " + ", ".join(f"`{s}`" for s in report["sources"]), "",
             "## Held-out error", "",
             "Each grid point (all its repeats) predicted by the fit without it, next to the "
             "uncalibrated prior on the same points. MAPE = mean absolute percentage error; "
             "coverage = share of held-out measurements inside their 90 % interval.", "",
             "| engine / DCP | points | MAPE total (prior) | MAPE decode step (prior) | "
             "MAPE prefill (prior) | max error total | 90 % coverage |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for key, s in cv.items():
        lines.append(
            f"| {key} | {s['n_points']} | {_pct(s['cv_mape_total'])} "
            f"({_pct(s['prior_mape_total'])}) | {_pct(s['cv_mape_step'])} "
            f"({_pct(s['prior_mape_step'])}) | {_pct(s['cv_mape_ttft'])} "
            f"({_pct(s['prior_mape_ttft'])}) | {_pct(s['cv_max_ape_total'])} | "
            f"{_pct(s['interval_coverage'])} |")
    if not cv:
        lines.append("| (fewer than two grid points per engine: no cross-validation) | | | | | | |")
    lines += ["", "## What the data moved", "",
              "Terms freed from their prior, per pooling level "
              "(engine_advisor.model.fit.fitting); the rest keep it.",
              ""]
    for key, free in sorted(report["free_terms"].items()):
        lines.append(f"- {key}: {', '.join(free) if free else 'none (the prior holds)'}")
    for engine, by_model in sorted(report["routing_diversity"].items()):
        for name, rho in sorted(by_model.items()):
            lines.append(f"- {engine}: random-weight rows of {name} route with diversity "
                         f"{rho:g} (1 = a trained router)")
    lines += ["", "## Calibrated ranges", "",
              "| configuration (engine/GPU/GPUs/DCP) | served model | points | context tokens "
              "| batch | output |", "|---|---|---:|---|---|---|"]
    for key, per_model in sorted(report["calibrated_ranges"].items()):
        for served, rng in sorted(per_model.items()):
            def span(d: str, r: dict = rng) -> str:
                lo, hi = r[d]
                return f"{lo:,.0f}" if lo == hi else f"{lo:,.0f} .. {hi:,.0f}"
            lines.append(f"| {key} | {served} | {report['calibrated_points'].get(key, 0)} | "
                         f"{span('context_tokens')} | {span('batch_size')} | "
                         f"{span('output_tokens')} |")
    lines += ["", "## Memory fractions", ""]
    for key, mem in sorted(report["memory_fractions"].items()):
        lines.append(f"- {key}: safe {mem['safe'] or 'none'}, "
                     f"out-of-memory {mem['unsafe'] or 'none'}")
    lines += ["", "## Crossovers", ""]
    if report["crossovers"]:
        for x in report["crossovers"]:
            lines.append(f"- batch {x['batch_size']} x {x['output_tokens']} output tokens: "
                         f"{x['from']} -> {x['to']} near {x['context_tokens']:,} context tokens")
    else:
        lines.append("- none within the plotted context range")
    lines += ["", "## Coefficients", "", "| engine | " + " | ".join(
        next(iter(report["coefficients"].values())).keys()) + " |",
        "|---|" + "---:|" * len(next(iter(report["coefficients"].values())))]
    for e, coefs in sorted(report["coefficients"].items()):
        lines.append(f"| {e} | " + " | ".join(f"{v:.4g}" for v in coefs.values()) + " |")
    lines += [""]
    for p in report.get("plots", []):
        lines += [f"![{p}]({p})", ""]
    return "\n".join(lines)
