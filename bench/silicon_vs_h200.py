"""aiconfigurator-core's H200 tables against the project's own H200 measurements, on the shapes
both cover: decode attention (same heads, head_dim, KV dtype, batch, context) and the bare
2-GPU collectives of ``calibrate dcp`` (same bytes per rank).

Usage: .venv/bin/python bench/silicon_vs_h200.py   (needs engine-advisor[silicon])
Prints a markdown table: per kernel family the matched points, the median signed difference
(aiconfigurator - ours) / ours, and the median and max absolute difference.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from engine_advisor.calibration.silicon.tables import (
    find_table,
    load_system,
    package_systems_dir,
    read_table,
)

PROFILES = Path(__file__).resolve().parents[1] / "calibration" / "profiles"
GQA = {"gqa-8x128": (64, 8), "gqa-4x128": (32, 4), "gqa-1x128": (8, 1)}
MLA = {"mla-128h": 128, "mla-64h": 64}
DTYPE = {"bf16": "bfloat16", "fp8": "fp8"}


def _rows(name: str) -> list[dict]:
    with (PROFILES / name).open(newline="") as fh:
        return list(csv.DictReader(fh))


def _index(t: dict, keys: tuple[str, ...], mask: np.ndarray) -> dict[tuple, float]:
    """Median latency (seconds) per key over the rows in ``mask``."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    cols = [t[k][mask] for k in keys]
    for i, lat in enumerate(t["latency"][mask]):
        groups[tuple(c[i] for c in cols)].append(lat * 1e-3)
    return {k: float(np.median(v)) for k, v in groups.items()}


LARGE = 256 * 2**20     # bytes read (decode) or sent (collectives) per call


def _stats(pairs: list[tuple[float, float, float]]) -> tuple:
    """(points, median signed, median abs, max abs difference, median signed on large calls)."""
    ours, theirs, nbytes = np.array(pairs).T
    d = (theirs - ours) / ours
    big = d[nbytes >= LARGE]
    return (len(d), float(np.median(d)), float(np.median(np.abs(d))),
            float(np.max(np.abs(d))), float(np.median(big)) if len(big) else float("nan"))


def compare() -> list[tuple[str, tuple]]:
    system = load_system(package_systems_dir(), "h200_sxm")
    ours = _rows("h200.csv")
    out = []
    gcols = {"kernel_source": str, "num_heads": float, "num_key_value_heads": float,
             "head_dim": float, "kv_cache_dtype": str, "batch_size": float, "step": float,
             "window_size": float, "latency": float}
    for engine, kernel in (("sglang", "fa3"), ("vllm", "vllm_flash_attn_fa3")):
        t = read_table(find_table(system, "attention", engine, "generation_attention_perf"),
                       gcols, system.root)
        mask = (t["kernel_source"] == kernel) & (t["head_dim"] == 128) & (t["window_size"] == 0)
        idx = _index(t, ("num_heads", "num_key_value_heads", "kv_cache_dtype", "batch_size",
                         "step"), mask)
        pairs = [(float(r["seconds"]), idx[k], float(r["bytes_read"])) for r in ours
                 if r["kind"] == "attention" and r["shape"] in GQA
                 and (k := (*map(float, GQA[r["shape"]]), DTYPE[r["dtype"]],
                            float(r["batch_size"]), float(r["context_tokens"]) - 1)) in idx]
        out.append((f"GQA decode bf16: our SDPA vs {engine} {kernel}", _stats(pairs)))
    mcols = {"kernel_source": str, "num_heads": float, "kv_cache_dtype": str,
             "batch_size": float, "step": float, "latency": float}
    t = read_table(find_table(system, "mla", "sglang", "generation_mla_perf"), mcols, system.root)
    kernel = str(t["kernel_source"][0])
    idx = _index(t, ("num_heads", "kv_cache_dtype", "batch_size", "step"),
                 np.ones(len(t["latency"]), dtype=bool))
    for dtype in ("bf16", "fp8"):
        pairs = [(float(r["seconds"]), idx[k], float(r["bytes_read"])) for r in ours
                 if r["kind"] == "attention" and r["shape"] in MLA and r["dtype"] == dtype
                 and (k := (float(MLA[r["shape"]]), DTYPE[dtype], float(r["batch_size"]),
                            float(r["context_tokens"]) - 1)) in idx]
        out.append((f"MLA decode {dtype}: our Triton split-KV vs sglang {kernel}",
                    _stats(pairs)))
    ncols = {"op_name": str, "nccl_dtype": str, "num_gpus": float, "message_size": float,
             "latency": float}
    ref = find_table(system, "comm", "nccl", "nccl_perf")
    t = read_table(ref, ncols, system.root)
    idx = _index(t, ("op_name", "num_gpus", "message_size"), t["nccl_dtype"] == "half")
    # ours: bytes each rank sends; nccl-tests: all-gather counts the gathered buffer
    for op, theirs, factor in (("all_gather", "all_gather", 2), ("all_to_all", "alltoall", 1)):
        pairs = [(float(r["comm_s"]), idx[k], float(r["message_bytes"]))
                 for r in _rows("h200-dcp.csv")
                 if r["kind"] == "collective" and r["backend"] == op and r["dcp"] == "2"
                 and (k := (theirs, 2.0, float(r["message_bytes"]) * factor / 2)) in idx]
        out.append((f"{op} 2 GPUs: our torch.distributed vs nccl-tests {ref.version}",
                    _stats(pairs)))
    return out


def main() -> None:
    print("| kernel family | points | median diff | median abs diff | max abs diff | "
          "median diff, calls >= 256 MiB |")
    print("|---|---|---|---|---|---|")
    for name, (n, med, mabs, mx, big) in compare():
        print(f"| {name} | {n} | {med:+.0%} | {mabs:.0%} | {mx:.0%} | {big:+.0%} |")


if __name__ == "__main__":
    main()
