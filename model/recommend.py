"""The recommender: every feasible (engine, dcp) ranked by predicted total time."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import TypeAdapter

from model.capabilities import exclusions as capability_exclusions
from model.capabilities import prefill_factors
from model.costmodel import (
    EXTRAPOLATION_REL_SIGMA,
    UNCALIBRATED_REL_SIGMA,
    CostModel,
    Query,
    dcp_combine_features,
    kv_read_seconds,
)
from model.hardware import dcp_comm_model, kv_read_model
from model.kv import KvLayout
from model.memory import MEM_FLAGS, MemoryChoice, choose_fraction, kv_capacity_tokens
from model.schemas import ConfigPrediction, Exclusion, Recommendation
from model.workload import ENGINES, Config, Workload

CROSSOVER_RANGE = (1024, 4 * 1024 * 1024)
CROSSOVER_GRID = np.geomspace(*CROSSOVER_RANGE, 64)
_PREDICTIONS = TypeAdapter(list[ConfigPrediction])


class NoEligibleConfiguration(ValueError):
    """No configuration may be recommended (none calibrated, or all excluded)."""

    field = "allow_extrapolation"


@dataclass
class Evaluated:
    config: Config
    pred: ConfigPrediction
    eligible: bool
    step_parts: dict[str, float]


def candidates(model: CostModel, w: Workload,
               layout: KvLayout) -> tuple[list[Config], list[Exclusion]]:
    engines = w.engines or list(ENGINES)
    tp = w.num_gpus
    dcps = dcp_sizes(w)
    ok, excluded = [], []
    blocked = capability_exclusions(w.requirements, layout)
    for engine in engines:
        if engine not in model.engines:
            excluded.append(Exclusion(engine=engine, reason=f"the loaded model has no calibration "
                                      f"data for {engine}"))
            continue
        if engine in blocked:
            excluded.append(Exclusion(engine=engine, reason=blocked[engine]))
            continue
        for dcp in dcps:
            reason = dcp_constraint(engine, dcp, tp, layout)
            if reason:
                excluded.append(Exclusion(engine=engine, dcp_size=dcp, reason=reason))
            else:
                ok.append(Config(engine, dcp))
    return ok, excluded


def dcp_sizes(w: Workload) -> list[int]:
    """The DCP sizes to consider: the workload's, else every divisor of its TP size."""
    tp = w.num_gpus
    return sorted(set(w.dcp_sizes)) if w.dcp_sizes else [d for d in range(1, tp + 1) if tp % d == 0]


def dcp_constraint(engine: str, dcp: int, tp: int, layout: KvLayout) -> str | None:
    """Why ``engine`` cannot run DCP ``dcp`` with TP ``tp`` on this model, or None."""
    if tp % dcp:
        return f"dcp {dcp} does not divide the tensor-parallel size {tp}"
    if dcp == 1 or layout.attention == "unknown":
        return None
    if layout.attention == "gqa":
        if engine == "sglang":
            return "SGLang implements DCP for MLA attention only; this model uses GQA"
        replicas = tp // layout.kv_heads if layout.kv_heads and layout.kv_heads < tp else 1
        if replicas % dcp:
            return (f"vLLM needs (tp // kv_heads) % dcp == 0: KV heads {layout.kv_heads} on tp "
                    f"{tp} are replicated {replicas}x, so dcp {dcp} cannot stripe them")
    return None


def memory_choice(model: CostModel, engine: str, gpu: str) -> MemoryChoice:
    """The memory fraction for ``engine`` on ``gpu`` (memoised per model: its data is fixed)."""
    cache = model.__dict__.setdefault("_memory_choices", {})
    key = (engine, gpu)
    if key not in cache:
        cache[key] = choose_fraction(engine, gpu, **model.safe_fractions(engine, gpu))
    return cache[key]


def _config_arrays(model: CostModel, configs: tuple[Config, ...], grid_configs: tuple[Config, ...],
                   points: int) -> tuple[np.ndarray, np.ndarray]:
    """Engine indices and DCP sizes of build_query's rows (memoised per model: hot path)."""
    cache = model.__dict__.setdefault("_config_arrays", {})
    key = (configs, grid_configs, points)
    hit = cache.get(key)
    if hit is None:
        names = model.engine_names
        rows = list(configs) + [c for c in grid_configs for _ in range(points)]
        hit = (np.array([names.index(c.engine) for c in rows], dtype=np.intp),
               np.array([c.dcp_size for c in rows], dtype=float))
        if len(cache) > 1024:
            cache.clear()
        cache[key] = hit
    return hit


def build_query(model: CostModel, w: Workload, layout: KvLayout, configs: list[Config],
                contexts: np.ndarray | None = None, grid_configs: list[Config] = ()) -> Query:
    """One row per config at the workload's context, or per (config, context) when
    ``contexts`` is given (config-major); ``grid_configs`` appends (config, context) rows for
    those configs after the per-config rows (one prediction pass for table and curves)."""
    names = model.engine_names
    if contexts is not None:
        configs, grid_configs, grid = [], configs, np.asarray(contexts, dtype=float)
    else:
        grid = CROSSOVER_GRID if grid_configs else CROSSOVER_GRID[:0]
    engine, dcp = _config_arrays(model, tuple(configs), tuple(grid_configs), len(grid))
    m, k = len(configs), len(grid_configs)
    n = len(engine)
    ctx = np.empty(n)
    ctx[:m] = w.context_tokens
    ctx[m:].reshape(k, len(grid))[:] = grid
    out = np.full(n, float(w.output_tokens))
    batch = np.full(n, float(w.batch_size))
    kv = np.full(n, layout.bytes_per_token / layout.shards(w.num_gpus))
    gpu = w.gpu_spec()
    read = kv_read_seconds(kv_read_model(gpu), ctx, out, batch, kv, dcp)
    scale = None
    share = w.requirements.prefix_reuse_share if w.requirements else 0.0
    if share > 0:  # cached prefix tokens skip prefill (model/capabilities.py, per engine)
        scale = prefill_factors(names, share)[engine]
    return Query(engine, ctx, out, batch, kv, dcp, read, dcp_combine_features(gpu, batch, dcp),
                 scale)


def evaluate(model: CostModel, w: Workload, layout: KvLayout,
             configs: list[Config]) -> list[Evaluated]:
    """Every config's prediction, memory and calibration status at the workload's context."""
    return _evaluate(model, w, layout, configs, curves=False)[0]


def _evaluate(model: CostModel, w: Workload, layout: KvLayout, configs: list[Config],
              curves: bool) -> tuple[list[Evaluated], list[Config], np.ndarray | None]:
    """``evaluate`` plus, when ``curves``, the eligible configs' totals on CROSSOVER_GRID
    (shape (eligible, grid)), from the same prediction pass."""
    if not configs:
        return [], [], None
    gpu = w.gpu_spec()
    kv_source = kv_read_model(gpu).source
    kv_gpu = layout.bytes_per_token / layout.shards(w.num_gpus)
    demand = w.batch_size * (w.context_tokens + w.output_tokens)
    values = {"context_tokens": w.context_tokens, "batch_size": w.batch_size,
              "kv_bytes_per_token": layout.bytes_per_token, "output_tokens": w.output_tokens}
    cover = [model.coverage(c.engine, gpu.name, w.num_gpus, c.dcp_size, values) for c in configs]
    eligible = [c for c, (cal, _) in zip(configs, cover, strict=True)
                if cal or w.allow_extrapolation]
    grid_configs = eligible if curves and len(eligible) > 1 else []
    m = len(configs)
    extra = np.array([UNCALIBRATED_REL_SIGMA if not cal else EXTRAPOLATION_REL_SIGMA * d
                      for cal, d in cover])
    p = model.predict(build_query(model, w, layout, configs, grid_configs=grid_configs), extra,
                      interval_rows=m)
    grid_totals = (p.total[m:].reshape(len(grid_configs), len(CROSSOVER_GRID))
                   if grid_configs else None)
    mems = {e: memory_choice(model, e, gpu.name) for e in {c.engine for c in configs}}
    totals, prefills, tpots = p.total[:m].tolist(), p.prefill[:m].tolist(), p.tpot[:m].tolist()
    los, his, parts = p.total_lo[:m].tolist(), p.total_hi[:m].tolist(), p.step_parts[:m].tolist()
    rows = []
    for i, c in enumerate(configs):
        frac = mems[c.engine].fraction
        cap = kv_capacity_tokens(c.engine, frac, gpu.memory_bytes, layout.weight_bytes,
                                 w.num_gpus, kv_gpu, c.dcp_size)
        cal, dist = cover[i]
        rows.append({
            "engine": c.engine, "dcp_size": c.dcp_size, "total_s": totals[i],
            "prefill_s": prefills[i], "decode_s": max(totals[i] - prefills[i], 0.0),
            "tpot_s": tpots[i], "interval_s": (los[i], his[i]), "calibrated": cal,
            "extrapolated": (not cal) or dist > 0, "mem_fraction": frac,
            "kv_capacity_tokens": cap, "fits_in_memory": demand <= cap,
            "kv_read_source": kv_source})
    preds = _PREDICTIONS.validate_python(rows)  # one pydantic-core call for all configs
    out = [Evaluated(c, preds[i], cover[i][0] or w.allow_extrapolation,
                     dict(zip(("fixed", "kv_read", "dcp"), parts[i], strict=True)))
           for i, c in enumerate(configs)]
    return out, grid_configs, grid_totals


def total_curves(model: CostModel, w: Workload, layout: KvLayout, configs: list[Config],
                 contexts: np.ndarray) -> np.ndarray:
    """Predicted total seconds, shape (len(configs), len(contexts))."""
    q = build_query(model, w, layout, configs, contexts)
    return model.predict_total(q).reshape(len(configs), len(contexts))


def crossovers(contexts: np.ndarray, totals: np.ndarray) -> list[tuple[int, int, int]]:
    """Where the argmin of ``totals`` changes: (context, config index before, after)."""
    best = np.argmin(totals, axis=0)
    flips = np.nonzero(best[1:] != best[:-1])[0]
    found = []
    for i in flips:
        a, b = best[i], best[i + 1]
        d0 = totals[a, i] - totals[b, i]
        d1 = totals[a, i + 1] - totals[b, i + 1]
        # interpolate the root of (a - b) in log-context between the two grid points
        t = d0 / (d0 - d1) if d0 != d1 else 0.5
        lo, hi = math.log(contexts[i]), math.log(contexts[i + 1])
        x = math.exp(lo + t * (hi - lo))
        found.append((int(round(x)), int(a), int(b)))
    return found


def crossover_near(model: CostModel, w: Workload, layout: KvLayout,
                   configs: list[Config]) -> int | None:
    """The context nearest the workload's where the best of ``configs`` changes, or None."""
    if len(configs) < 2:
        return None
    return nearest_crossover(w, total_curves(model, w, layout, configs, CROSSOVER_GRID))


def nearest_crossover(w: Workload, grid_totals: np.ndarray | None) -> int | None:
    """The crossover on CROSSOVER_GRID nearest to the workload's context, or None."""
    if grid_totals is None:
        return None
    found = crossovers(CROSSOVER_GRID, grid_totals)
    if not found:
        return None
    return min(found, key=lambda f: abs(math.log(f[0] / w.context_tokens)))[0]


def launch_command(engine: str, dcp: int, fraction: float, w: Workload) -> list[str]:
    name = w.model or "MODEL"
    tp = str(w.num_gpus)
    if engine == "vllm":
        cmd = ["vllm", "serve", name, "--tensor-parallel-size", tp]
        if dcp > 1:
            cmd += ["--decode-context-parallel-size", str(dcp)]
        cmd += ["--gpu-memory-utilization", f"{fraction:.2f}"]
        if w.kv_cache_dtype == "fp8":
            cmd += ["--kv-cache-dtype", "fp8"]
    else:
        cmd = ["python", "-m", "sglang.launch_server", "--model-path", name, "--tp", tp]
        if dcp > 1:
            cmd += ["--dcp-size", str(dcp)]
        cmd += ["--mem-fraction-static", f"{fraction:.2f}"]
        if w.kv_cache_dtype == "fp8":
            cmd += ["--kv-cache-dtype", "fp8_e4m3"]
    return cmd


def _overlap(a: ConfigPrediction, b: ConfigPrediction) -> bool:
    return a.interval_s[0] <= b.interval_s[1] and b.interval_s[0] <= a.interval_s[1]


def recommend(model: CostModel, w: Workload, version: str) -> Recommendation:
    layout = w.kv_layout()
    configs, excluded = candidates(model, w, layout)
    if not configs:
        exc = NoEligibleConfiguration("every configuration is excluded: "
                                      + "; ".join(x.describe() for x in excluded))
        exc.field = "requirements" if w.requirements else "engines"
        raise exc
    evals, _, grid_totals = _evaluate(model, w, layout, configs, curves=True)
    eligible = sorted((e for e in evals if e.eligible), key=lambda e: e.pred.total_s)
    if not eligible:
        names = ", ".join(f"{e.config.engine} dcp {e.config.dcp_size}" for e in evals) or "none"
        raise NoEligibleConfiguration(
            f"no configuration is calibrated for {w.gpu_spec().name} x {w.num_gpus} "
            f"(candidates: {names}); set allow_extrapolation to rank them on the physics prior, "
            "or calibrate this hardware")
    best = eligible[0]
    bp = best.pred
    others = [e for e in eligible[1:] if e.config.engine != best.config.engine] or eligible[1:]
    rival = others[0] if others else None
    speedup = rival.pred.total_s / bp.total_s if rival else None
    if not bp.calibrated or (rival and _overlap(bp, rival.pred)):
        confidence = "low"
    elif bp.extrapolated or not bp.fits_in_memory:
        confidence = "medium"
    else:
        confidence = "high"
    cross = nearest_crossover(w, grid_totals)
    reasons = _reasons(w, best, rival, speedup, cross, confidence)
    mem = memory_choice(model, best.config.engine, w.gpu_spec().name)
    reasons.append(mem.reason)
    return Recommendation(
        engine=best.config.engine, dcp_size=best.config.dcp_size, mem_fraction=bp.mem_fraction,
        mem_fraction_flag=MEM_FLAGS[best.config.engine],
        predictions=[e.pred for e in sorted(evals, key=lambda e: e.pred.total_s)],
        speedup=speedup, confidence=confidence, crossover_context_tokens=cross,
        kv_capacity_tokens=bp.kv_capacity_tokens, fits_in_memory=bp.fits_in_memory,
        launch_command=launch_command(best.config.engine, best.config.dcp_size, bp.mem_fraction, w),
        reasons=reasons, excluded=excluded, model_version=version)


def _label(e: Evaluated) -> str:
    return f"{e.config.engine} dcp {e.config.dcp_size}"


def _reasons(w: Workload, best: Evaluated, rival: Evaluated | None, speedup: float | None,
             cross: int | None, confidence: str) -> list[str]:
    bp = best.pred
    r = [f"{_label(best)} is predicted fastest: {bp.total_s:.1f} s for {w.batch_size} sequences "
         f"of {w.context_tokens:,} + {w.output_tokens:,} tokens"
         + (f", {speedup:.2f}x faster than {_label(rival)} ({rival.pred.total_s:.1f} s)"
            if rival and speedup else "")]
    parts = best.step_parts
    step = sum(parts.values()) or 1.0
    share = parts["kv_read"] / step
    r.append(f"decode is {bp.decode_s / max(bp.total_s, 1e-12):.0%} of the time; reading the KV "
             f"cache is {share:.0%} of each {step * 1e3:.1f} ms decode step"
             + (f", DCP {best.config.dcp_size} spreads those reads over {best.config.dcp_size} "
                f"GPUs for {parts['dcp'] * 1e3:.1f} ms of combine per step"
                if best.config.dcp_size > 1
                else ", with no DCP combine cost"))
    if rival and rival.config.dcp_size != best.config.dcp_size:
        rp = rival.step_parts
        r.append(f"{_label(rival)}: KV reads {rp['kv_read'] * 1e3:.1f} ms, DCP combine "
                 f"{rp['dcp'] * 1e3:.1f} ms, fixed {rp['fixed'] * 1e3:.1f} ms per step")
    if cross:
        r.append(f"the best engine changes near {cross:,} context tokens")
    if not bp.calibrated:
        r.append(f"{_label(best)} has no calibration data on {w.gpu_spec().name} x {w.num_gpus}: "
                 "extrapolated from the physics prior (allow_extrapolation)")
    elif bp.extrapolated:
        r.append("the workload lies outside the calibrated range: the interval is widened")
    if not bp.fits_in_memory:
        demand = w.batch_size * (w.context_tokens + w.output_tokens)
        r.append(f"KV demand {demand:,} tokens exceeds "
                 f"the {bp.kv_capacity_tokens:,} tokens this configuration holds: the engine will "
                 "queue or preempt sequences, so real times will be longer")
    if confidence == "low" and rival:
        r.append(f"low confidence: the prediction intervals of {_label(best)} and "
                 f"{_label(rival)} overlap")
    r.extend(_profile_reasons(w))
    return r


def _profile_reasons(w: Workload) -> list[str]:
    """Which measured hardware profiles the physics used (none: the spec sheet)."""
    gpu = w.gpu_spec()
    out = []
    read = kv_read_model(gpu)
    if read.source != "spec":
        bw = getattr(read, "asymptotic_bandwidth", None)
        out.append(f"KV-read physics from the measured {gpu.name} profile "
                   f"({read.source.removeprefix('profile:')})"
                   + (f": {bw / 1e12:.2f} TB/s effective on large reads, "
                      f"{bw / gpu.hbm_bandwidth:.0%} of the {gpu.hbm_bandwidth / 1e12:.1f} TB/s "
                      "spec" if bw else ""))
    comm = dcp_comm_model(gpu)
    if comm is not None:
        extra = [d for d in dcp_sizes(w) if d > 1 and d not in comm.measured]
        out.append(f"DCP combine cost shaped by the measured {gpu.name} DCP profile "
                   f"({comm.file_name}; dcp {', '.join(map(str, comm.measured))} measured"
                   + (f", {', '.join(map(str, extra))} extrapolated" if extra else "") + ")")
    return out
