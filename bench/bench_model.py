"""In-process speed of the cost model: one recommendation, and batched predictions.

Usage: .venv/bin/python bench/bench_model.py [--workloads 10000] [--repeats 7]
To time another checkout (``git worktree add DIR COMMIT``), run its script with
``PYTHONPATH=$(.venv/bin/python bench/checkout.py DIR)``: the editable install would otherwise
import this checkout's modules.
Targets: >= 2,000,000 (engine, dcp, workload) evaluations/s batched; <= 100 us for one
recommendation in-process (validation included).

Times are the process's CPU time (time.process_time): on a machine shared with other work the
wall clock also counts the time the process waits for a CPU. The cost model runs one BLAS
thread (model/__init__.py), so CPU time is the work done.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.predict.batch import predict_grid
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Config, Workload

SEED = {"output_tokens": 2048, "batch_size": 64, "preset": "kimi-k3", "gpu": "B300",
        "num_gpus": 8}


def bench_single(n: int, repeats: int, fresh: bool) -> list[float]:
    """CPU seconds per recommendation of the seed's batch and output. ``fresh``: every call a
    context not seen before, so nothing of a previous answer can be reused but the crossover
    scan, which does not depend on the context; else the seed workload (204,800 tokens) every
    call, so the memoised terms (engine_advisor.model.physics.terms.Physics) answer."""
    m = default_model()
    rng = np.random.default_rng(1)
    contexts = (rng.integers(1024, 1_000_000, n * (repeats + 1)).tolist() if fresh
                else [204_800] * (n * (repeats + 1)))
    payloads = [{**SEED, "context_tokens": c} for c in contexts]
    recommend(m, Workload.model_validate(payloads[-1]), m.version)  # warm-up
    per_call = []
    for r in range(repeats):
        batch = payloads[r * n:(r + 1) * n]
        t0 = time.process_time()
        for payload in batch:
            recommend(m, Workload.model_validate(payload), m.version)
        per_call.append((time.process_time() - t0) / n)
    return per_call


def bench_batched(n_workloads: int, repeats: int) -> tuple[list[float], int]:
    m = default_model()
    rng = np.random.default_rng(0)
    workloads = [Workload.model_validate({**SEED, "context_tokens": int(c)})
                 for c in rng.integers(1024, 1_000_000, n_workloads)]
    configs = [Config(e, d) for e in ("vllm", "sglang") for d in (1, 2, 4, 8)]
    rates = []
    for _ in range(repeats):
        t0 = time.process_time()
        pred = predict_grid(m, workloads, configs)
        rates.append(len(pred.total) / (time.process_time() - t0))
    return rates, len(workloads) * len(configs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, default=10_000)
    ap.add_argument("--single", type=int, default=2_000, help="recommendations per repeat")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    fresh = bench_single(args.single, args.repeats, fresh=True)
    same = bench_single(args.single, args.repeats, fresh=False)
    rates, evals = bench_batched(args.workloads, args.repeats)
    print(f"one recommendation (validate + recommend), {args.repeats} x {args.single} calls, CPU"
          " time per call (target <= 100 us):")
    for label, times in (("a new context every call", fresh),
                         ("the seed workload every call (memoised terms)", same)):
        print(f"  {label}: median {statistics.median(times) * 1e6:.0f} us,"
              f" best {min(times) * 1e6:.0f} us")
    print(f"batched predict_grid, {args.workloads:,} workloads x 8 configs = {evals:,} evaluations,"
          f" {args.repeats} repeats, per CPU second:")
    print(f"  median {statistics.median(rates):,.0f} evaluations/s, best {max(rates):,.0f}"
          f"  (target >= 2,000,000)")
    print("  (the batched time includes building the query from validated Workload objects)")


if __name__ == "__main__":
    main()
