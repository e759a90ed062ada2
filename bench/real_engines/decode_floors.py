#!/usr/bin/env python3
"""Where a decode step's fixed costs sit: the evidence behind docs/validation.md's "Decode steps".

The default model prices a fused-MoE call's fixed cost (``moe_fixed``) from DeepSeek-V2-Lite,
its only MoE model and its only MLA model, so the fit cannot tell a MoE call's cost from an MLA
layer's. This script prints what independent measurements say, and what the fit gives if the
excess is the MLA layers'.

``tables``: aiconfigurator-core's vLLM tables on one GPU (``--systems-dir``: its
``aiconfigurator_core/systems``; by default the installed package's):

- the fused-MoE call at one token, per table shape: its latency against ``t0 + weight bytes /
  bandwidth`` fitted over the bf16 shapes (gated experts read three matrices, ReLU^2 ones two);
- the MLA module (projections, norms, attention) at one sequence: its latency at the smallest
  context, the weights it reads, and the KV read rate its latency grows at with the context, at
  batch 1 and batch 8;
- the Gated DeltaNet decode kernels (convolution update, recurrent update) at one sequence.

``profiles``: decode-step kernel tables of real engines (``kernel_profile.py --decode N`` wrote
``ctxCxB.csv`` and ``ctxCxB-outM.csv`` per point, M = 1 + N): their difference over N is one
step's kernels, counted and timed by kind, beside the default model's terms for that step.

``launches``: each shipped model's batch-1 decode step at its shortest context, less the default
model's byte and FLOP terms (what is left is fixed cost), beside the kernels the engine launched
per forward pass in the shipped prefill profiles (``bench/data/h200-real/profiles``, memory copies
and sets left out): a fixed cost per launch that holds across models says the fixed costs follow
the kernels a layer runs, not the count of its layers.

``trial``: the default model refitted with each MLA layer charged the per-layer fixed costs of
``--mla-units`` more decoder layers (a what-if: the shipped physics is unchanged), and the
left-out medians of the H200 MoE and hybrid models' batch-1 steps, beside the shipped model's.

    .venv/bin/python bench/real_engines/decode_floors.py tables --systems-dir .../systems
    .venv/bin/python bench/real_engines/decode_floors.py trial --mla-units 2.65
    .venv/bin/python bench/real_engines/decode_floors.py profiles --profiles DIR
    .venv/bin/python bench/real_engines/decode_floors.py launches
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

import numpy as np

MS = 1e-3
BF16 = 2


def _table(system, op: str, table: str, cols: dict):
    from engine_advisor.calibration.silicon.tables import find_table, read_table
    ref = find_table(system, op, "vllm", table)
    return read_table(ref, cols, system.root), ref


def tables(args) -> None:
    from engine_advisor.calibration.silicon.tables import load_system, package_systems_dir
    root = Path(args.systems_dir) if args.systems_dir else package_systems_dir()
    system = load_system(root, args.system)

    t, ref = _table(system, "moe", "moe_perf", {
        "moe_dtype": str, "num_tokens": float, "hidden_size": float, "inter_size": float,
        "topk": float, "num_experts": float, "moe_tp_size": float, "moe_ep_size": float,
        "distribution": str, "latency": float})
    print(f"fused MoE at one token, bf16 ({ref.relative(root)}, vLLM {ref.version})")
    one = ((t["num_tokens"] == 1) & (t["moe_ep_size"] == 1) & (t["moe_tp_size"] == 1)
           & (t["moe_dtype"] == "bfloat16") & (t["distribution"] == "balanced"))
    shapes: dict[tuple, float] = {}
    for i in np.flatnonzero(one):
        key = tuple(int(t[c][i]) for c in ("num_experts", "hidden_size", "inter_size", "topk"))
        shapes[key] = min(shapes.get(key, np.inf), t["latency"][i] * MS)
    keys = sorted(shapes)
    # Nemotron-H's experts are ReLU^2 (up and down only); the others gated (gate, up, down)
    mats = [2 if (e, h, n) == (128, 2688, 1856) else 3 for e, h, n, _ in keys]
    nbytes = np.array([m * k * h * n * BF16
                       for (e, h, n, k), m in zip(keys, mats, strict=True)], float)
    sec = np.array([shapes[k] for k in keys])
    # a call faster than its weights at the spec sheet's bandwidth reads fewer bytes than
    # assumed (its table shape is not the routed one): shown, not fitted
    spec_bw = float((system.spec.get("gpu") or {}).get("mem_bw") or np.inf)
    ok = nbytes / sec <= spec_bw
    slope, t0 = np.polyfit(nbytes[ok], sec[ok], 1)
    print(f"  line over {int(ok.sum())} shapes: {t0 * 1e6:.1f} us + bytes at "
          f"{1 / slope / 1e12:.2f} TB/s")
    for (e, h, n, k), b, s, fitted in zip(keys, nbytes, sec, ok, strict=True):
        fit = t0 + slope * b
        print(f"  E={e:4} hidden={h:5} inter={n:5} top-{k:<2} {b / 1e6:7.1f} MB "
              f"{s * 1e6:7.1f} us  line {fit * 1e6:7.1f} us ({s / fit:.2f} x)"
              + ("" if fitted else "  (faster than its bytes at the spec bandwidth)"))

    t, ref = _table(system, "mla", "mla_generation_module_perf", {
        "kernel_source": str, "kv_cache_dtype": str, "gemm_type": str, "num_heads": float,
        "batch_size": float, "step": float, "latency": float, "model": str})
    print(f"MLA module ({ref.relative(root)}: {t['model'][0]}, bf16 KV and GEMMs)")
    sel = (t["kv_cache_dtype"] == "bfloat16") & (t["gemm_type"] == "bfloat16")
    for heads in (16, 128):
        for batch in (1, 8):
            m = sel & (t["num_heads"] == heads) & (t["batch_size"] == batch)
            if m.sum() < 3:
                continue
            steps, lat = t["step"][m], t["latency"][m] * MS
            lo, hi = np.argmin(steps), np.argmax(steps)
            kv = (steps[hi] - steps[lo]) * 576 * BF16 * batch     # the latent + rope per token
            rate = kv / (lat[hi] - lat[lo])
            # DeepSeek-V3's weights per rank at ``heads``: q_a, kv_a (whole), q_b, the two
            # absorbed up-projections and o_proj (split by heads)
            w = (7168 * 1536 + 7168 * 576 + 1536 * heads * 192 + 2 * heads * 128 * 512
                 + heads * 128 * 7168) * BF16
            print(f"  {heads:3} heads, batch {batch}: {lat[lo] * 1e6:6.1f} us at {int(steps[lo])} "
                  f"tokens (weights {w / 1e6:.0f} MB), KV read {rate / 1e12:.2f} TB/s "
                  f"to {int(steps[hi])} tokens")

    t, ref = _table(system, "linear_attention", "gdn_perf", {
        "kernel_source": str, "phase": str, "batch_size": float, "num_v_heads": float,
        "latency": float})
    m = (t["phase"] == "generation") & (t["batch_size"] == 1)
    print(f"Gated DeltaNet decode kernels at one sequence ({ref.relative(root)})")
    for k in sorted(set(t["kernel_source"][m])):
        lat = t["latency"][m & (t["kernel_source"] == k)] * MS
        print(f"  {k}: {np.min(lat) * 1e6:.1f}-{np.max(lat) * 1e6:.1f} us")


def _left_out_step_medians(model, name: str, engine: str, rows) -> float:
    from engine_advisor.model.fit.fitting import QUANTITIES, observations
    from engine_advisor.model.fit.rows import row_shape
    held = [r for r in rows if r.model == name and r.engine == engine]
    obs = observations(held)
    ratios = []
    for i, j in enumerate(obs.row):
        r = held[j]
        if QUANTITIES[obs.qty[i]] != "step" or r.batch_size > 1:
            continue
        level = model.level_for(r.engine, r.gpu, row_shape(r).key)
        ratios.append(model.engines[level].predict(obs.X[i:i + 1])[0] / obs.y[i])
    return float(np.median(ratios))


def trial(args) -> None:
    from engine_advisor.model.fit.costmodel import CostModel
    from engine_advisor.model.fit.default import fitted_rows, left_out_rows, unfitted_rows
    from engine_advisor.model.formulas.layout import N_LAYERS
    from engine_advisor.model.physics import shape as shape_module
    from engine_advisor.model.physics import terms

    names = ("qwen3-30b-a3b", "mixtral-8x7b", "nemotron-3-nano-30b-a3b", "qwen3-next-80b-a3b-fp8")

    def medians() -> dict:
        model = CostModel.fit(fitted_rows())
        out = {}
        for name in names:
            rows = unfitted_rows() if name in ("nemotron-3-nano-30b-a3b",
                                               "qwen3-next-80b-a3b-fp8") else left_out_rows(name)
            for engine in ("vllm", "sglang"):
                out[name, engine] = _left_out_step_medians(model, name, engine, rows)
        return out

    shipped = medians()
    base_init = terms.Physics.__init__

    def charged(self, shape, si, tp):          # the what-if: MLA layers' extra fixed costs
        base_init(self, shape, si, tp)
        if shape.attention == "mla":
            k = list(self.K)
            k[N_LAYERS] += args.mla_units * shape.n_full_layers
            self.K = tuple(k)

    def fresh() -> None:                         # shapes keep their Physics: drop them
        shape_module.preset_shape.cache_clear()
        shape_module._row_shape.cache_clear()

    terms.Physics.__init__ = charged
    fresh()
    try:
        tried = medians()
    finally:
        terms.Physics.__init__ = base_init
        fresh()
    print(f"batch-1 decode step, left out: predicted / measured, median "
          f"(shipped | MLA layers +{args.mla_units} layer units)")
    for (name, engine), r in shipped.items():
        print(f"  {name:26} {engine:6} {r:5.2f} x | {tried[name, engine]:5.2f} x")


# a decode kernel's kind: the first pattern that matches wins
DECODE_KINDS = (
    ("linear", r"selective_state|causal_conv1d|gated_delta|fused_recurrent|gdn|kda|mamba|ssd"),
    ("moe", r"fused_moe|moe_align|count_and_sort|moe_sum|topk|router|expert"),
    ("attention", r"flash|fmha|attention|mla|paged"),
    ("gemm", r"nvjet|gemm|matmul|cublas|sm90_xmma|cutlass|deep_gemm|gemv|splitk"),
)


def decode_kind(name: str) -> str:
    for k, pattern in DECODE_KINDS:
        if re.search(pattern, name, re.I):
            return k
    return "other"


def _kernels(path: Path) -> tuple[float, dict[str, tuple[int, float]]]:
    lines = path.read_text().splitlines()
    client = float(re.search(r"client ([\d.]+) s", lines[0]).group(1))
    return client, {r["kernel"]: (int(r["calls"]), float(r["total_us"]))
                    for r in csv.DictReader(lines[1:])}


def step_kernels(one: Path, many: Path, steps: int) -> tuple[float, dict[str, tuple[float, float]]]:
    """(client seconds per step, kernel -> (calls, us) per step): ``many``'s table less
    ``one``'s, over the ``steps`` decode steps between them."""
    c1, k1 = _kernels(one)
    cn, kn = _kernels(many)
    out = {}
    for name in set(k1) | set(kn):
        calls = (kn.get(name, (0, 0.0))[0] - k1.get(name, (0, 0.0))[0]) / steps
        us = (kn.get(name, (0, 0.0))[1] - k1.get(name, (0, 0.0))[1]) / steps
        if calls > 0.5 or us > 0.5:
            out[name] = (calls, us)
    return (cn - c1) / steps, out


def _predicted_step(engine: str, model: str, ctx: int, batch: int) -> dict[str, float] | None:
    """The default model's decode-step terms (ms) for one point of a shipped model."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernels import point_terms  # the prefill tables' twin (bench/real_engines/kernels.py)

    from engine_advisor.model.physics.terms import TERMS
    got = point_terms(engine, model, ctx, batch, "tpot")
    if got is None:
        return None
    x, coef = got
    return {t: x[i] * coef[i] * 1e3 for i, t in enumerate(TERMS) if x[i] * coef[i] > 0}


def profiles(args) -> None:
    root = Path(args.profiles)
    for many in sorted(root.glob("*/ctx*-out*.csv")):
        m = re.fullmatch(r"ctx(\d+)x(\d+)-out(\d+)", many.stem)
        one = many.with_name(f"ctx{m.group(1)}x{m.group(2)}.csv") if m else None
        if one is None or not one.exists():
            continue
        ctx, batch, out = map(int, m.groups())
        engine, model = many.parent.name.split("-", 1)
        step_s, kernels = step_kernels(one, many, out - 1)
        by: dict[str, list[float]] = {}
        for name, (calls, us) in kernels.items():
            acc = by.setdefault(decode_kind(name), [0.0, 0.0])
            acc[0] += calls
            acc[1] += us
        busy = sum(us for _, us in kernels.values())
        launches = sum(c for c, _ in kernels.values())
        print(f"{engine} {model}, {batch} x {ctx} tokens: a step {step_s * 1e3:.2f} ms "
              f"(client), kernels {busy / 1e3:.2f} ms busy in {launches:.0f} launches")
        for k in ("gemm", "moe", "attention", "linear", "other"):
            calls, us = by.get(k, (0.0, 0.0))
            print(f"  {k:9} {calls:6.0f} launches {us / 1e3:7.3f} ms")
        pred = _predicted_step(engine, model, ctx, batch)
        if pred:
            print("  model:   " + " ".join(f"{t} {v:.3f}" for t, v in pred.items())
                  + f" = {sum(pred.values()):.2f} ms")
        if args.kernels:
            for name, (calls, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
                print(f"    {us:8.1f} us {calls:5.1f} x  {decode_kind(name):9} {name[:90]}")


FIXED_TERMS = ("layer_fixed", "moe_fixed")
PROFILES = Path(__file__).resolve().parents[2] / "bench/data/h200-real/profiles"


def pass_launches(table: Path, passes: int) -> float:
    """Kernel launches per forward pass of a prefill profile table (copies and sets left out)."""
    lines = table.read_text().splitlines()
    return sum(int(r["calls"]) for r in csv.DictReader(lines[1:])
               if not r["kernel"].startswith(("Memset", "Memcpy"))) / passes


def fixed_parts(engine: str) -> list[tuple[str, int, float, float]]:
    """(model, context, measured step s, its fixed part s) of each shipped H200 model's batch-1
    step at its shortest context: the step less the default model's other terms."""
    from engine_advisor.model.fit.default import default_model, fitted_rows, unfitted_rows
    from engine_advisor.model.fit.fitting import QUANTITIES, observations
    from engine_advisor.model.fit.rows import row_shape
    from engine_advisor.model.physics.terms import TERMS
    model = default_model()
    fixed = np.array([t in FIXED_TERMS for t in TERMS])
    rows = [r for r in fitted_rows() + unfitted_rows() if r.engine == engine and r.gpu == "H200"]
    obs = observations(rows)
    best: dict[str, tuple] = {}
    for i, j in enumerate(obs.row):
        r = rows[j]
        if QUANTITIES[obs.qty[i]] != "step" or r.batch_size > 1:
            continue
        if r.model not in best or r.context_tokens < best[r.model][0]:
            em = model.engines[model.level_for(r.engine, r.gpu, row_shape(r).key)]
            other = float((obs.X[i] * em.coef_)[~fixed].sum())
            best[r.model] = (r.context_tokens, float(obs.y[i]), float(obs.y[i]) - other)
    return [(name, *v) for name, v in sorted(best.items())]


def launches(args) -> None:
    root = Path(args.profiles)
    print(f"{args.engine}: the batch-1 step's fixed part (the step less the default model's "
          "byte and FLOP terms) and kernel launches per prefill pass")
    per = []
    for name, ctx, step, fixed in fixed_parts(args.engine):
        table = root / f"{args.engine}-{name}" / "ctx16384x1.csv"    # two 8,192-token passes
        n = pass_launches(table, 2) if table.exists() else None
        us = f"{fixed / n * 1e6:5.2f} us a launch" if n else "(no profile)"
        if n:
            per.append(fixed / n)
        print(f"  {name:26} {ctx:6} tokens: step {step * 1e3:5.2f} ms, fixed "
              f"{fixed * 1e3:5.2f} ms, launches {n or 0:5.0f}  {us}")
    if per:
        print(f"  per launch: {min(per) * 1e6:.2f}-{max(per) * 1e6:.2f} us, median "
              f"{float(np.median(per)) * 1e6:.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tables", help="aiconfigurator-core's vLLM tables: the fixed costs")
    t.add_argument("--systems-dir", help="aiconfigurator_core/systems (default: installed)")
    t.add_argument("--system", default="h200_sxm")
    r = sub.add_parser("trial", help="refit with MLA layers charged extra layer units")
    r.add_argument("--mla-units", type=float, default=2.65)
    p = sub.add_parser("profiles", help="decode-step kernels of kernel_profile.py --decode")
    p.add_argument("--profiles", required=True, help="folder of ENGINE-PRESET/ tables")
    p.add_argument("--kernels", action="store_true", help="every kernel of a step too")
    n = sub.add_parser("launches", help="batch-1 steps' fixed parts against kernel launches")
    n.add_argument("--engine", default="vllm", choices=("vllm", "sglang"))
    n.add_argument("--profiles", default=str(PROFILES), help="prefill profile tables")
    args = ap.parse_args(argv)
    {"tables": tables, "trial": trial, "profiles": profiles,
     "launches": launches}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
