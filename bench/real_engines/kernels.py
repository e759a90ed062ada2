#!/usr/bin/env python3
"""The kernel profiles of real engines set against the cost model's prefill terms.

``kernel_profile.py`` (on the GPU machine) wrote, per engine, model and point, every CUDA kernel's
total time under the engine's own torch profiler. This script sorts the kernels into the terms of
``engine_advisor.model.physics.terms`` and prints, per term, the kernels' milliseconds beside the
term's physics at the silicon's achievable rate (coefficient 1) and the default model's
prediction, so that the inverse efficiency each engine's kernels reach on each term is read off a
measurement, not a fit:

    python bench/real_engines/kernels.py [--profiles bench/data/h200-real/profiles] [--kernels]

Kernels that no term stands for (norms, activations, quantisation of activations, copies) are
``elementwise``; ``gaps`` is the client's time less the kernels' busy time (host work the GPU
waits for: scheduling, input preparation, the server's request handling). Runs on the CPU in a
few seconds.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine_advisor.model.fit.default import default_model, real_rows, unfitted_rows  # noqa: E402
from engine_advisor.model.fit.rows import row_case  # noqa: E402
from engine_advisor.model.physics.features import case_features  # noqa: E402
from engine_advisor.model.physics.terms import TERMS  # noqa: E402
from engine_advisor.model.predict.predictor import predictor_for  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "bench/data/h200-real/profiles"
# kernel name -> the term whose work it does; the first pattern that matches wins
KINDS = (
    # Mamba2's SSD (and its conv1d, on a model whose linear layers are Mamba2: ``family``)
    ("pf_ssd", r"chunk_scan|chunk_state|state_passing|bmm_chunk|chunk_cumsum"),
    # the chunked delta rule of Gated DeltaNet and KDA, and their conv1d
    ("pf_linear", r"gated_delta|chunk_fwd_kernel_o|kkt|recompute_w_u|solve_tril|merge_16x16|"
                  r"chunk_local_cumsum|causal_conv1d|fused_gdn|qkvzba|fused_post_conv|"
                  r"gdn_prefill|fused_recurrent"),
    ("pf_moe", r"fused_moe|moe_align|count_and_sort|moe_sum|topk|router|expert"),
    ("pf_attn", r"flash|fmha|attention|mla"),
    ("pf_gemm", r"nvjet|gemm|matmul|cublas|sm90_xmma|cutlass"),
)
TERM_NAMES = ("pf_gemm", "pf_moe", "pf_attn", "pf_linear", "pf_ssd", "elementwise", "gaps")


def kind(name: str, ssd: bool = False) -> str:
    """The term a kernel's work belongs to; ``ssd``: the model's linear layers are Mamba2's, so
    that their short convolution goes with the SSD."""
    for term, pattern in KINDS:
        if re.search(pattern, name, re.I):
            return "pf_ssd" if ssd and term == "pf_linear" else term
    return "elementwise"


def read(path: Path, ssd: bool | None = None) -> tuple[dict[str, float], float, float,
                                                        list[tuple[str, float]]]:
    """(ms per term, client s, busy s, (kernel, ms) most first) of one profile table;
    ``ssd`` None: Mamba2 when the table has SSD kernels."""
    lines = path.read_text().splitlines()
    head = lines[0]
    client = float(re.search(r"client ([\d.]+) s", head).group(1))
    busy = float(re.search(r"busy ([\d.]+) s", head).group(1))
    per = dict.fromkeys(TERM_NAMES, 0.0)
    kernels = [(r["kernel"], float(r["total_us"]) / 1e3) for r in csv.DictReader(lines[1:])]
    if ssd is None:
        ssd = any(kind(name) == "pf_ssd" for name, _ in kernels)
    for name, ms in kernels:
        per[kind(name, ssd)] += ms
    per["gaps"] = max(client - busy, 0.0) * 1e3
    return per, client, busy, kernels


def point_terms(engine: str, model: str, ctx: int, batch: int, part: str = "prefill"):
    """(features, the engine's coefficients) of one point of a shipped model under the default
    model: its prefill's terms, or one decode step's (``part`` "tpot"); None for a model the
    shipped rows do not hold."""
    rows = [r for r in real_rows() + unfitted_rows() if r.engine == engine and r.model == model]
    if not rows:
        return None
    row = rows[0].model_copy(update={"context_tokens": ctx, "batch_size": batch,
                                     "prefix_share": 0.0})
    case = row_case(row, 1.0)
    # the engine's coefficients for this model (its fused-MoE kernel's factor included)
    coef = predictor_for(default_model()).coefficients(engine, row.gpu, case.shape, case.tp)[0]
    return getattr(case_features(case), part)[0], coef


def features(engine: str, model: str, ctx: int, batch: int):
    """The default model's prefill terms for this point: (unit-efficiency ms, predicted ms)."""
    got = point_terms(engine, model, ctx, batch)
    if got is None:
        return None
    x, coef = got
    unit = {t: x[TERMS.index(t)] * 1e3 for t in TERMS}
    pred = {t: x[TERMS.index(t)] * coef[TERMS.index(t)] * 1e3 for t in TERMS}
    unit["pf_attn"] += unit["pf_mla"]
    pred["pf_attn"] += pred["pf_mla"]
    return unit, pred


def prefill_tables(profiles: Path = DATA) -> list[Path]:
    """The prefill profiles' tables, not a decode profile's: its two tables (one output token
    and 1 + N) make N decode steps (bench/real_engines/decode_floors.py)."""
    return [p for p in sorted(profiles.glob("*/ctx*.csv"))
            if "-out" not in p.stem and not any(p.parent.glob(f"{p.stem}-out*.csv"))]


def table(profiles: Path = DATA) -> list[dict]:
    """One row per profiled point: engine, model, prompts, client ms, and per term the kernels'
    ms with the physics at coefficient 1 and the default model's ms (None where a term has none)."""
    out = []
    for path in prefill_tables(profiles):
        engine, model = path.parent.name.split("-", 1)
        ctx, batch = map(int, re.fullmatch(r"ctx(\d+)x(\d+)", path.stem).groups())
        per, client, _, kernels = read(path)
        both = features(engine, model, ctx, batch)
        unit, pred = both or ({}, {})
        out.append({"engine": engine, "model": model, "ctx": ctx, "batch": batch,
                    "client_ms": client * 1e3, "kernels": kernels,
                    "predicted_ms": sum(pred.values()) if pred else None,
                    "terms": {t: (per[t], unit.get(t), pred.get(t)) for t in TERM_NAMES}})
    return out


def markdown(rows: list[dict]) -> str:
    """The compact table docs/validation.md shows: per term the kernels' ms and, in brackets,
    that over the term's physics at the silicon's achievable rate."""
    head = ("| engine | model | prompts | measured (client) | GEMMs | fused MoE | attention "
            "| delta rule (GDN) | Mamba2 SSD | elementwise | gaps | default model |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        cells = []
        for t in TERM_NAMES:
            ms, unit, _ = r["terms"][t]
            if unit:
                cells.append(f"{ms:.0f} ({ms / unit:.2f} ×)")
            else:
                cells.append("–" if ms < 0.05 else f"{ms:.0f}")
        pred = "" if r["predicted_ms"] is None else f"{r['predicted_ms']:.0f}"
        lines.append(f"| {r['engine']} | {r['model']} | {r['batch']} × {r['ctx']:,} | "
                     f"{r['client_ms']:.0f} | " + " | ".join(cells) + f" | {pred} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", type=Path, default=DATA)
    ap.add_argument("--kernels", type=int, default=0, metavar="N",
                    help="also list each point's N longest kernels and the term each went to")
    a = ap.parse_args()
    rows = table(a.profiles)
    print(markdown(rows))
    for r in rows if a.kernels else ():
        print(f"\n{r['engine']} {r['model']} {r['batch']} x {r['ctx']}:")
        ssd = r["terms"]["pf_ssd"][0] > 0
        for name, ms in r["kernels"][:a.kernels]:
            print(f"  {ms:8.1f} ms  {kind(name, ssd):11s}  {name[:90]}")


if __name__ == "__main__":
    main()
