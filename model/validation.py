"""How the fitted model holds against the real-engine rows it was fitted on, point by point.

Every figure here is held out: ``CostModel.held_out`` predicts each point from a fit without it
(``engine_advisor.model.fit.fitting``), next to what the uncalibrated physics prior predicts.
``summary`` gives the acceptance figures the docs quote (``docs/validation.md``,
``bench/validate_real.py``):

- the median held-out error per engine, GPU and quantity (total, the batch's prefill, one
  decode step), and the prior's on the same points;
- for each (engine, GPU, model, quantity) group, whether the fit is worse than the prior;
- KV capacity against the engines' own logs;
- on points both engines ran: whether the faster engine (or a tie within ``TIE``) is what the
  held-out predictions pick, and how close the predicted SGLang / vLLM ratio is to the measured.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from engine_advisor.model.decision.crossover import TIE
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.dataset import Measurement
from engine_advisor.model.fit.rows import row_case, row_shape
from engine_advisor.model.physics.features import case_features


def _rel(pred: float, meas: float) -> float:
    return abs(pred / meas - 1.0)


def error_table(model: CostModel, gpu: str | None = None) -> list[dict]:
    """Median held-out and prior errors per (engine, GPU, model, quantity)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in model.held_out:
        if gpu is None or r["gpu"] == gpu:
            groups[(r["engine"], r["gpu"], r["model"], r["quantity"])].append(r)
    out = []
    for (engine, g, mdl, qty), recs in sorted(groups.items()):
        out.append({"engine": engine, "gpu": g, "model": mdl, "quantity": qty,
                    "points": len(recs),
                    "held_out": float(np.median([_rel(r["held_out"], r["measured"])
                                                 for r in recs])),
                    "prior": float(np.median([_rel(r["prior"], r["measured"])
                                              for r in recs]))})
    return out


def engine_pairs(model: CostModel, gpu: str) -> list[dict]:
    """Points both engines ran on ``gpu`` (same model, context, batch, output): measured and
    held-out predicted totals of each."""
    totals: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in model.held_out:
        if r["gpu"] == gpu and r["quantity"] == "total" and r["dcp_size"] == 1:
            key = (r["model"], r["context_tokens"], r["batch_size"], r["output_tokens"])
            totals[key][r["engine"]] = r
    out = []
    for key, by in sorted(totals.items()):
        if {"vllm", "sglang"} <= set(by):
            v, s = by["vllm"], by["sglang"]
            out.append({"model": key[0], "context_tokens": key[1], "batch_size": key[2],
                        "output_tokens": key[3], "vllm": v["measured"], "sglang": s["measured"],
                        "vllm_pred": v["held_out"], "sglang_pred": s["held_out"],
                        "vllm_prior": v["prior"], "sglang_prior": s["prior"]})
    return out


def choice_scores(pairs: Sequence[dict], prefix: str = "_pred") -> dict:
    """Of ``pairs``: the share where the predicted pick is right (the measured faster engine,
    or any engine when the measured ones tie, or a predicted tie when they tie), and the
    median |log| error of the predicted SGLang / vLLM ratio where they differ by > TIE."""
    right, ratio_err = 0, []
    for p in pairs:
        mv, ms = p["vllm"], p["sglang"]
        pv, ps = p["vllm" + prefix], p["sglang" + prefix]
        measured_tie = abs(ms / mv - 1.0) <= TIE
        predicted_tie = abs(ps / pv - 1.0) <= TIE
        picked = "vllm" if pv <= ps else "sglang"
        faster = "vllm" if mv <= ms else "sglang"
        right += measured_tie or (picked == faster and not predicted_tie)
        if not measured_tie:
            ratio_err.append(abs(np.log((ps / pv) / (ms / mv))))
    n = len(pairs)
    return {"points": n, "right": right, "share_right": right / n if n else None,
            "ratio_median_factor": float(np.exp(np.median(ratio_err))) if ratio_err else None,
            "differing_points": len(ratio_err)}


def capacity_table(rows: Sequence[Measurement]) -> list[dict]:
    """Predicted KV capacity (``engine_advisor.model.physics.memory`` through the compiled formulas,
    at the row's own memory fraction) against each (engine, model, fraction)'s logged figure."""

    seen, out = set(), []
    for r in rows:
        key = (r.engine, r.gpu, r.num_gpus, r.model, r.mem_fraction, r.dcp_size)
        if r.kv_capacity_tokens is None or key in seen or not r.model:
            continue
        seen.add(key)
        pred = int(case_features(row_case(r)).capacity[0])
        out.append({"engine": r.engine, "gpu": r.gpu, "model": r.model,
                    "mem_fraction": r.mem_fraction, "logged": r.kv_capacity_tokens,
                    "predicted": pred, "error": pred / r.kv_capacity_tokens - 1.0})
    return out


NAMES = {"total": "total", "ttft": "batch prefill", "step": "decode step"}


def prior_ratios(model: CostModel, gpu: str) -> dict:
    """The uncalibrated prior's predicted / measured ratio over every figure on ``gpu``: its
    geometric mean, the share within 2x, and the range of the batch prefill (TTFT) ratios."""
    recs = [r for r in model.held_out if r["gpu"] == gpu]
    ratio = np.array([r["prior"] / r["measured"] for r in recs])
    ttft = ratio[np.array([r["quantity"] == "ttft" for r in recs], dtype=bool)]
    out = {"figures": len(ratio)}
    if len(ratio):
        out.update(geomean=float(np.exp(np.log(ratio).mean())),
                   within_2x=float(np.mean((ratio >= 0.5) & (ratio <= 2.0))))
    if len(ttft):
        out.update(ttft_min=float(ttft.min()), ttft_max=float(ttft.max()),
                   ttft_outside_2x=int(np.sum((ttft < 0.5) | (ttft > 2.0))))
    return out


def unseen_model_ratios(model: CostModel, rows: Sequence[Measurement]) -> dict:
    """Predicted / measured over real rows of a model that ``model`` was not fitted on: the
    uncalibrated prior's (each engine's, ``engine_prior``), and the fitted engine's on that GPU
    (this model's physics with the efficiencies fitted on other models: what a recommendation
    for it gives, ``transferred``).
    Per predictor: the geometric mean, the share within 2x, and per quantity (total, the
    batch's prefill, one decode step) the geometric mean and range. Random-weight MoE rows are
    routed as a trained router would (diversity 1)."""
    from engine_advisor.model.fit.estimator import prior_vector
    from engine_advisor.model.fit.fitting import QUANTITIES, engine_prior, observations

    seen = {r["model"] for r in model.held_out} & {r.model for r in rows}
    if seen:
        raise ValueError(f"the model was fitted on {sorted(seen)}: not an unseen model")
    obs = observations(rows)
    # the uncalibrated prior: each engine's (the physics, its profiled kernels' terms)
    coef = {(r.engine, r.gpu): prior_vector(engine_prior(r.engine, r.gpu)) for r in rows}
    preds = {"prior": np.array([obs.X[i] @ coef[rows[j].engine, rows[j].gpu]
                                for i, j in enumerate(obs.row)])}
    keys = {(r.engine, r.gpu) for r in rows}
    fitted = np.empty(len(obs.y))
    for i, j in enumerate(obs.row):
        level = model.level_for(rows[j].engine, rows[j].gpu, row_shape(rows[j]).key)
        fitted[i] = (model.engines[level].predict(obs.X[i:i + 1])[0] if level is not None
                     else preds["prior"][i])
    preds["transferred"] = fitted
    out: dict = {"figures": len(obs.y), "engines_gpus": sorted(keys),
                 "models": sorted({r.model for r in rows})}
    for name, pred in preds.items():
        ratio = pred / obs.y
        out[name] = {"geomean": float(np.exp(np.log(ratio).mean())),
                     "within_2x": float(np.mean((ratio >= 0.5) & (ratio <= 2.0)))}
        for q, qname in enumerate(QUANTITIES):
            rq = ratio[obs.qty == q]
            if len(rq):
                out[name][qname] = (float(np.exp(np.log(rq).mean())), float(rq.min()),
                                    float(rq.max()))
    return out


def leave_model_out(rows: Sequence[Measurement], name: str) -> dict:
    """``unseen_model_ratios`` of the rows of model ``name`` against a fit on all the other
    ``rows`` (the default model's data): how the prior and the fit do on a model neither was
    built on."""
    held = [r for r in rows if r.model == name]
    if not held:
        raise ValueError(f"no rows of {name!r}")
    fit = CostModel.fit([r for r in rows if r.model != name], sources=[f"without {name}"])
    return unseen_model_ratios(fit, held)


def unseen_markdown(u: dict) -> str:
    """``unseen_model_ratios`` in one sentence (docs/validation.md)."""
    p, t = u["prior"], u["transferred"]
    return (f"{', '.join(u['models'])} on "
            f"{', '.join(f'{e} / {g}' for e, g in u['engines_gpus'])} ({u['figures']} figures), "
            f"left out: the prior {p['geomean']:.3f} in the geometric mean, "
            f"{p['within_2x']:.0%} within 2x (batch prefill {p['ttft'][1]:.2f}-"
            f"{p['ttft'][2]:.2f}x, decode step {p['step'][1]:.2f}-{p['step'][2]:.2f}x); a fit "
            f"on the other models, this model's physics with their efficiencies (transferred), "
            f"{t['geomean']:.3f} (batch prefill {t['ttft'][0]:.2f}x, decode step "
            f"{t['step'][0]:.2f}x in the geometric mean).")


def markdown(s: dict) -> str:
    """The tables of ``summary`` as the docs show them (docs/validation.md)."""
    out = ["| engine | quantity | points | prior (median error) | calibrated, held out |",
           "|---|---|---|---|---|"]
    for key, e in s["errors"].items():
        engine, qty = key.split("/")
        out.append(f"| {engine} | {NAMES[qty]} | {e['points']} | {e['prior']:.1%} | "
                   f"{e['held_out']:.1%} |")
    out += ["", "| engine | model | quantity | prior | calibrated |", "|---|---|---|---|---|"]
    for g in s["groups"]:
        out.append(f"| {g['engine']} | {g['model']} | {NAMES[g['quantity']]} | "
                   f"{g['prior']:.1%} | {g['held_out']:.1%} |")
    out += ["", "| engine | model | fraction | KV tokens logged | predicted | error |",
            "|---|---|---|---|---|---|"]
    for c in s["capacity"]:
        out.append(f"| {c['engine']} | {c['model']} | {c['mem_fraction']:.2f} | "
                   f"{c['logged']:,} | {c['predicted']:,} | {c['error']:+.2%} |")
    c, p = s["choice"], s["choice_prior"]
    out += ["", f"Engine choice on the {c['points']} points both engines ran: the faster engine "
                f"(or a tie within 5 %) picked at {c['right']} ({c['share_right']:.0%}); the "
                f"prior {p['right']} ({p['share_right']:.0%}). Where they differ by more than "
                f"5 % ({c['differing_points']} points), the predicted SGLang / vLLM ratio is "
                f"{c['ratio_median_factor']:.3f}x the measured one in the median (prior "
                f"{p['ratio_median_factor']:.3f}x). Held-out 90 % intervals cover "
                + ", ".join(f"{v:.0%} ({k})" for k, v in s["coverage"].items()) + "."]
    r = s["prior_ratios"]
    if "geomean" in r:
        out += ["", f"The uncalibrated prior over all {r['figures']} figures: predicted / measured "
                    f"{r['geomean']:.3f} in the geometric mean, {r['within_2x']:.0%} within 2x"
                    + (f"; batch prefill {r['ttft_min']:.2f}-{r['ttft_max']:.2f}x, "
                       f"{r['ttft_outside_2x']} outside 2x" if "ttft_min" in r else "") + "."]
    return "\n".join(out)


def summary(model: CostModel, rows: Sequence[Measurement], gpu: str = "H200") -> dict:
    table = error_table(model, gpu)
    by_eq: dict[str, dict] = {}
    for engine in sorted({t["engine"] for t in table}):
        for qty in ("total", "ttft", "step"):
            recs = [r for r in model.held_out if r["engine"] == engine and r["gpu"] == gpu
                    and r["quantity"] == qty]
            if recs:
                by_eq[f"{engine}/{qty}"] = {
                    "held_out": float(np.median([_rel(r["held_out"], r["measured"])
                                                 for r in recs])),
                    "prior": float(np.median([_rel(r["prior"], r["measured"]) for r in recs])),
                    "points": len(recs)}
    pairs = engine_pairs(model, gpu)
    return {"errors": by_eq, "groups": table, "pairs": pairs,
            "choice": choice_scores(pairs), "choice_prior": choice_scores(pairs, "_prior"),
            "capacity": capacity_table([r for r in rows if r.gpu == gpu]),
            "prior_ratios": prior_ratios(model, gpu),
            "coverage": {k: m.get("coverage") for k, m in model.metrics.items()
                         if k.endswith("/" + gpu)}}
