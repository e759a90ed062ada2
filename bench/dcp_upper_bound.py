"""The most Decode Context Parallelism can save at small batch, from an engine's own MLA tables.

DCP divides one thing: the context-dependent part of each MLA layer's decode call (the latent KV
it reads and the scores it computes). Everything else in a step (weights, experts, collectives,
launch gaps) is the same with or without it, and DCP adds a query gather and a combine per MLA
layer. So at batch B and context C, the saving per step is at most

    n_mla_layers x (module(B, C) - module(B, ~1K)) x (1 - 1/d)

where ``module`` is the engine's measured MLA layer (projections and attention) at the per-rank
head count of plain TP. This script reads that bound from aiconfigurator's vLLM 0.27.0 MLA
module table for Kimi-K3 on GB300, collected on the Kimi-K3 serving branch, and prints it next
to the per-step savings vllm-project/vllm#50055 published (``model/data/published.csv``, rows
``k3-120k-*``).

It runs inside aiconfigurator's own virtual environment (not a dependency of engine-advisor)::

    python3 -m venv /tmp/aic && /tmp/aic/bin/pip install aiconfigurator==0.12.0
    /tmp/aic/bin/python bench/dcp_upper_bound.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

TABLE = "systems/data/gb300/mla/vllm/0.27.0/mla_generation_module_perf.parquet"
PUBLISHED = {1: (13.806, 10.544), 2: (16.192, 11.828)}  # batch: (TP8, DCP8) TPOT p50, ms


def module_ms(df, batch: int, context: float) -> float:
    """The table's latency (ms) at ``batch``, linearly interpolated in context."""
    import numpy as np

    rows = df[df.batch_size == batch].groupby("step").latency.mean().sort_index()
    return float(np.interp(context, rows.index.to_numpy(dtype=float), rows.to_numpy()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=float, default=120_000)
    ap.add_argument("--heads", type=int, default=12, help="per rank at TP 8 (Kimi-K3: 96 / 8)")
    ap.add_argument("--mla-layers", type=int, default=24)
    ap.add_argument("--dcp", type=int, default=8)
    ap.add_argument("--gemm", default="bfloat16", help="gemm_type column of the table")
    args = ap.parse_args()

    from importlib.metadata import version

    import aiconfigurator_core
    import pandas as pd

    path = Path(aiconfigurator_core.__file__).parent / TABLE
    df = pd.read_parquet(path)
    df = df[(df.model == "moonshotai/Kimi-K3") & (df.kv_cache_dtype == "fp8")
            & (df.num_heads == args.heads) & (df.gemm_type == args.gemm)]
    print(f"table: aiconfigurator-core {version('aiconfigurator-core')}, {TABLE}")
    print(f"Kimi-K3, fp8 KV, {args.heads} heads per rank, {args.gemm} GEMMs, "
          f"{args.mla_layers} MLA layers, context {args.context:,.0f}")
    print("| batch | MLA layers per step, ms | of which context-dependent | most DCP "
          f"{args.dcp} can save | published saving (TP8 - DCP8) |")
    print("|---|---|---|---|---|")
    for batch, (tp, dcp) in PUBLISHED.items():
        full = module_ms(df, batch, args.context) * args.mla_layers
        base = module_ms(df, batch, 1024) * args.mla_layers
        bound = (full - base) * (1 - 1 / args.dcp)
        print(f"| {batch} | {full:.2f} | {full - base:.2f} | {bound:.2f} | {tp - dcp:.2f} |")


if __name__ == "__main__":
    main()
