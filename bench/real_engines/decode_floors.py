#!/usr/bin/env python3
"""Where a decode step's fixed costs sit: the evidence behind docs/validation.md's "Decode steps".

The default model prices a decode step's fixed cost per kernel the engine launches
(``kernel_fixed``: each engine's kernels per part of a model,
``engine_advisor.model.engines.base.DecodeKernels``) and per fused-MoE call at the silicon's
floor (``moe_fixed``). This script prints what the engines and independent measurements say.

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
model's byte and FLOP terms and its fused-MoE calls' floor (what is left is the kernels' fixed
cost), over the kernels the engine's table counts for the model; and, where a decode profile of
the model is shipped (``bench/data/h200-real/profiles``), the kernels it shows beside the
table's count of them.

    .venv/bin/python bench/real_engines/decode_floors.py tables --systems-dir .../systems
    .venv/bin/python bench/real_engines/decode_floors.py profiles --profiles DIR
    .venv/bin/python bench/real_engines/decode_floors.py launches [--engine sglang]
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


def launch_count(kernels: dict[str, tuple[float, float]]) -> float:
    """Kernels launched in ``step_kernels``' table, memory copies and sets left out."""
    return sum(c for n, (c, _) in kernels.items() if not n.startswith(("Memset", "Memcpy")))


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
        launches = launch_count(kernels)
        print(f"{engine} {model}, {batch} x {ctx} tokens: a step {step_s * 1e3:.2f} ms "
              f"(client), kernels {busy / 1e3:.2f} ms busy in {launches:.0f} launches "
              "(copies and sets left out)")
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


FIXED_TERMS = ("kernel_fixed", "moe_fixed")
PROFILES = Path(__file__).resolve().parents[2] / "bench/data/h200-real/profiles"


def fixed_parts(engine: str) -> list[tuple[str, int, float, float, float]]:
    """(model, context, measured step s, its fixed part s, the fused-MoE calls' floor s) of
    each shipped H200 model's batch-1 step at its shortest context: the step less the default
    model's other terms, and the silicon's floor of its fused-MoE calls."""
    from engine_advisor.model.fit.default import default_model, fitted_rows, unfitted_rows
    from engine_advisor.model.fit.fitting import QUANTITIES, observations
    from engine_advisor.model.fit.rows import row_shape
    from engine_advisor.model.physics.terms import TERMS
    model = default_model()
    fixed = np.array([t in FIXED_TERMS for t in TERMS])
    moe = TERMS.index("moe_fixed")
    rows = [r for r in fitted_rows() + unfitted_rows() if r.engine == engine and r.gpu == "H200"]
    obs = observations(rows)
    best: dict[str, tuple] = {}
    for i, j in enumerate(obs.row):
        r = rows[j]
        if QUANTITIES[obs.qty[i]] != "step" or r.batch_size > 1:
            continue
        if r.model not in best or r.context_tokens < best[r.model][0]:
            em = model.engines[model.level_for(r.engine, r.gpu, row_shape(r).key)]
            parts = obs.X[i] * em.coef_
            # the calls at the silicon's floor (the term's physics), not at the fitted
            # coefficient, which carries whatever the kernels' count misses
            best[r.model] = (r.context_tokens, float(obs.y[i]),
                             float(obs.y[i] - parts[~fixed].sum()), float(obs.X[i][moe]))
    return [(name, *v) for name, v in sorted(best.items())]


def measured_launches(folder: Path) -> float | None:
    """Kernels one decode step launched in a decode profile (``ctx1024x1`` and its
    ``-out65``; memory copies and sets left out), or None without one."""
    one, many = folder / "ctx1024x1.csv", folder / "ctx1024x1-out65.csv"
    if not (one.exists() and many.exists()):
        return None
    return launch_count(step_kernels(one, many, 64)[1])


def launches(args) -> None:
    from engine_advisor.model.physics.launches import decode_launches, profiled_launches
    from engine_advisor.model.physics.shape import preset_shape
    root = Path(args.profiles)
    print(f"{args.engine}: the batch-1 step's fixed part (the step less the default model's "
          "byte and FLOP terms), the fused-MoE calls' floor in it, and the kernels the engine "
          "launches outside those calls (its table; a decode profile's count of all kernels "
          "beside the table's)")
    per = []
    for name, ctx, step, fixed, calls in fixed_parts(args.engine):
        shape = preset_shape(name, "bf16")
        n = decode_launches(args.engine, shape)
        seen = measured_launches(root / f"{args.engine}-{name}")
        said = (f", profiled {seen:4.0f} (table {profiled_launches(args.engine, shape):4.0f})"
                if seen else "")
        per.append((fixed - calls) / n)
        print(f"  {name:26} {ctx:6} tokens: step {step * 1e3:5.2f} ms, fixed "
              f"{fixed * 1e3:5.2f} ms (MoE calls {calls * 1e3:4.2f}), {n:5.0f} kernels: "
              f"{(fixed - calls) / n * 1e6:4.2f} us each{said}")
    print(f"  per kernel: {min(per) * 1e6:.2f}-{max(per) * 1e6:.2f} us, median "
          f"{float(np.median(per)) * 1e6:.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tables", help="aiconfigurator-core's vLLM tables: the fixed costs")
    t.add_argument("--systems-dir", help="aiconfigurator_core/systems (default: installed)")
    t.add_argument("--system", default="h200_sxm")
    p = sub.add_parser("profiles", help="decode-step kernels of kernel_profile.py --decode")
    p.add_argument("--profiles", required=True, help="folder of ENGINE-PRESET/ tables")
    p.add_argument("--kernels", action="store_true", help="every kernel of a step too")
    n = sub.add_parser("launches", help="batch-1 steps' fixed parts against kernel launches")
    n.add_argument("--engine", default="vllm", choices=("vllm", "sglang"))
    n.add_argument("--profiles", default=str(PROFILES), help="decode profile tables")
    args = ap.parse_args(argv)
    {"tables": tables, "profiles": profiles, "launches": launches}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
