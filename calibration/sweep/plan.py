"""``calibrate plan``: the points whose measurement would most settle the recommendation.

For each candidate context the recommender's own predictions
(``engine_advisor.model.predict.query.evaluate``, intervals widened outside the calibrated range and
for uncalibrated configurations) give every configuration a total time with a 90 % interval, read as
a normal distribution. The chance that a configuration beats the predicted best is ``P(k < best)``;
a point (configuration, context) scores its share of that decision risk times its own relative
uncertainty:

    score = P(involved in a flip of the best choice) x relative sd of its prediction

so points near a crossover with wide intervals come first, points far from any contest last.
A greedy pass keeps suggestions at least a factor 1.5 apart in context per configuration.
The default scan covers the workload's context / 8 .. x 8; by default only configurations the
model has data for are considered (``include_uncalibrated`` adds the others, whose physics-prior
intervals are wide and would otherwise crowd out the contest between calibrated ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engine_advisor.model.decision.crossover import CROSSOVER_GRID, crossovers
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.predict.query import candidates, coverage, total_curves
from engine_advisor.model.queries import evaluate
from engine_advisor.model.workload import Workload

Z90 = 1.645
MIN_SPACING = 1.5
MIN_FLIP = 0.01      # a point whose ranking is this certain cannot change the recommendation
SCAN_FACTOR = 8
SCAN_POINTS = 25


@dataclass
class PlanPoint:
    engine: str
    dcp_size: int
    context_tokens: int
    batch_size: int
    output_tokens: int
    predicted_total_s: float
    interval_s: tuple[float, float]
    flip_probability: float
    score: float
    reasons: list[str]


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def candidate_contexts(w: Workload, given: list[int] | None) -> list[int]:
    if given:
        return sorted(set(given))
    c = w.context_tokens
    grid = np.geomspace(max(c / SCAN_FACTOR, 256), c * SCAN_FACTOR, SCAN_POINTS)
    ctx = {int(round(x / 256) * 256) for x in grid} | {c}
    return sorted(x for x in ctx if x > 0)


def plan(model: CostModel, w: Workload, contexts: list[int] | None = None,
         n_points: int = 8, include_uncalibrated: bool = False) -> list[PlanPoint]:
    layout = w.model_shape()
    configs, _ = candidates(w, layout)
    if not include_uncalibrated:
        gpu = w.gpu_spec().name
        configs = [c for c in configs if coverage(model, c.engine, gpu, w.num_gpus, c.dcp_size,
                                                 layout.key, {})[0] != "uncalibrated"]
    if not configs:
        return []
    cross = [x for x, _, _ in crossovers(CROSSOVER_GRID, total_curves(model, w, layout, configs,
                                                                      CROSSOVER_GRID))]
    scored: list[PlanPoint] = []
    for ctx in candidate_contexts(w, contexts):
        wc = w.model_copy(update={"context_tokens": ctx})
        evals = evaluate(model, wc, configs)
        if not evals:
            continue
        preds = [e.pred for e in evals]
        sd = [max((p.interval_s[1] - p.interval_s[0]) / (2 * Z90), 1e-12) for p in preds]
        best = min(range(len(preds)), key=lambda i: preds[i].total_s)
        flip = [0.0] * len(preds)
        for k in range(len(preds)):
            if k == best:
                continue
            gap = preds[k].total_s - preds[best].total_s
            p = 1.0 - _phi(gap / math.hypot(sd[k], sd[best]))
            flip[k] = p
            flip[best] = max(flip[best], p)
        near = [x for x in cross if abs(math.log(x / ctx)) < math.log(MIN_SPACING)]
        for i, p in enumerate(preds):
            rel = sd[i] / max(p.total_s, 1e-12)
            prob = flip[i]
            reasons = []
            if near:
                reasons.append(f"near the predicted crossover at {near[0]:,} tokens")
            if not p.calibrated:
                reasons.append("no calibration data for this configuration")
            elif p.extrapolated:
                reasons.append("outside the calibrated range")
            if prob >= 0.05:
                rival = "the predicted best" if i != best else "its closest rival"
                reasons.append(f"{prob:.0%} chance it is ranked wrongly against {rival}")
            scored.append(PlanPoint(p.engine, p.dcp_size, ctx, w.batch_size, w.output_tokens,
                                    p.total_s, p.interval_s, prob, prob * rel, reasons))
    scored.sort(key=lambda s: -s.score)
    chosen: list[PlanPoint] = []
    for s in scored:
        if len(chosen) >= n_points:
            break
        if s.flip_probability < MIN_FLIP:
            continue
        near = any(c.engine == s.engine and c.dcp_size == s.dcp_size
                   and abs(math.log(c.context_tokens / s.context_tokens)) < math.log(MIN_SPACING)
                   for c in chosen)
        if not near:
            chosen.append(s)
    return chosen


def commands(points: list[PlanPoint], w: Workload) -> list[str]:
    """One ``calibrate run`` line per (engine, DCP) with the suggested contexts."""
    groups: dict[tuple[str, int], list[int]] = {}
    for p in points:
        groups.setdefault((p.engine, p.dcp_size), []).append(p.context_tokens)
    gpu = w.gpu_spec().name
    kv = int(w.model_shape().kv_bytes_per_token)
    return [f"engine-advisor calibrate run --engine {e} --dcp-size {d} --contexts "
            f"{','.join(map(str, sorted(c)))} --batch-sizes {w.batch_size} --output-tokens "
            f"{w.output_tokens} --kv-bytes-per-token {kv} --gpu {gpu} --num-gpus {w.num_gpus} "
            f"--url URL --out runs/plan-{e}-dcp{d}" for (e, d), c in sorted(groups.items())]
