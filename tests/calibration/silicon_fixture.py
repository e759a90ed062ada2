"""A small systems directory in aiconfigurator-core's layout and parquet schema (column names and
types as in the 0.12.0 package), with latencies made from known physics so the importer's
output can be checked against the numbers that generated it."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SYSTEM = "fake_sxm"
DEVICE = "NVIDIA FAKE SXM"
MLA_BW, MLA_FLOOR = 5e12, 10e-6           # bytes/s and seconds of the MLA decode call
GQA_BW, GQA_FLOOR = 4e12, 8e-6
CTX_MLA_FLOPS, CTX_GQA_FLOPS = 1e15, 8e14
GEMM_FLOPS, GEMM_WEIGHT_BW, GEMM_FLOOR = 1.5e15, 6e12, 2e-6
NCCL = {"all_reduce": (10e-6, 400e9), "all_gather": (8e-6, 600e9),
        "alltoall": (9e-6, 500e9), "reduce_scatter": (8e-6, 650e9)}
CUSTOM_AR = (4e-6, 300e9)                 # graph mode; eager is slower
BATCHES = (1, 4, 16, 64)
STEPS = (1023, 4095, 16383, 65535)

STR = pa.string()
I64 = pa.int64()
F64 = pa.float64()
HEAD = [("framework", STR), ("version", STR), ("device", STR), ("op_name", STR),
        ("kernel_source", STR)]
SCHEMAS = {
    "generation_mla_perf": HEAD + [("mla_dtype", STR), ("kv_cache_dtype", STR),
                                   ("num_heads", I64), ("batch_size", I64), ("isl", I64),
                                   ("tp_size", I64), ("step", I64), ("latency", F64)],
    "generation_attention_perf": HEAD + [("batch_size", I64), ("isl", I64), ("num_heads", I64),
                                         ("num_key_value_heads", I64), ("head_dim", I64),
                                         ("beam_width", I64), ("attn_dtype", STR),
                                         ("kv_cache_dtype", STR), ("step", I64),
                                         ("window_size", I64), ("latency", F64)],
    "gemm_perf": HEAD + [("gemm_dtype", STR), ("m", I64), ("n", I64), ("k", I64),
                         ("latency", F64)],
    "nccl_perf": HEAD + [("nccl_dtype", STR), ("num_gpus", I64), ("message_size", I64),
                         ("latency", F64)],
    "custom_allreduce_perf": HEAD + [("allreduce_dtype", STR), ("num_gpus", I64),
                                     ("message_size", I64), ("latency", F64), ("backend", STR)],
}
SCHEMAS["context_mla_perf"] = SCHEMAS["generation_mla_perf"]
SCHEMAS["context_attention_perf"] = SCHEMAS["generation_attention_perf"]
PATHS = {  # table -> (op, engine, version)
    "generation_mla_perf": ("mla", "sglang", "0.5.14"),
    "context_mla_perf": ("mla", "sglang", "0.5.14"),
    "generation_attention_perf": ("attention", "sglang", "0.5.14"),
    "context_attention_perf": ("attention", "sglang", "0.5.14"),
    "gemm_perf": ("gemm", "sglang", "0.5.14"),
    "nccl_perf": ("comm", "nccl", "2.29.2"),
    "custom_allreduce_perf": ("comm", "sglang", "0.5.14"),
}


def _row(op: str, kernel: str, **values) -> dict:
    return {"framework": "SGLang", "version": "0.5.14", "device": DEVICE, "op_name": op,
            "kernel_source": kernel, **values}


def mla_rows(context: bool = False) -> list[dict]:
    rows = []
    for dtype, eb in (("bfloat16", 2), ("fp8", 1)):
        for heads, b, s in itertools.product((8, 16, 128), BATCHES, STEPS):
            common = dict(mla_dtype="bfloat16", kv_cache_dtype=dtype, num_heads=heads,
                          batch_size=b, tp_size=128 // heads)
            if context:
                isl = s + 1
                ms = b * heads * (192 + 128) * isl ** 2 / CTX_MLA_FLOPS * 1e3
                rows.append(_row("mla_context", "trtllm_mla", isl=isl, step=0, latency=ms,
                                 **common))
            else:
                slow = 1.25 if heads == 128 else 1.0          # many heads: compute-bound
                ms = (MLA_FLOOR + slow * b * (s + 1) * 576 * eb / MLA_BW) * 1e3
                rows.append(_row("mla_generation", "trtllm_mla", isl=1, step=s, latency=ms,
                                 **common))
    return rows


def attention_rows(context: bool = False) -> list[dict]:
    """GQA shapes the importer uses plus decoys it must leave out: an MHA shape, sliding-window
    rows, and a slower Triton fallback measured more often than the fused kernel."""
    rows = []
    for kernel, slow, repeats in (("trtllm_mha", 1.0, 1), ("triton", 3.0, 2)):
        for (q, kv), b, s, (dtype, eb), window, _ in itertools.product(
                ((8, 1), (64, 8), (16, 16)), BATCHES, STEPS, (("bfloat16", 2), ("fp8", 1)),
                (0, 1024), range(repeats)):
            f = slow * (0.5 if window else 1.0) * (2.0 if q == kv else 1.0)
            common = dict(batch_size=b, num_heads=q, num_key_value_heads=kv, head_dim=128,
                          beam_width=1, kv_cache_dtype=dtype, window_size=window)
            if context:
                isl = s + 1
                ms = f * b * q * 256 * isl ** 2 / CTX_GQA_FLOPS * 1e3
                rows.append(_row("context_attention", kernel, isl=isl, attn_dtype=dtype,
                                 step=0, latency=ms, **common))
            else:
                ms = f * (GQA_FLOOR + b * (s + 1) * kv * 128 * 2 * eb / GQA_BW) * 1e3
                rows.append(_row("generation_attention", kernel, isl=1,
                                 attn_dtype="bfloat16", step=s, latency=ms, **common))
    return rows


def gemm_rows() -> list[dict]:
    rows = []
    for m, n, k in itertools.product((1, 8, 4096, 16384), (1024, 8192, 16384), (1024, 8192)):
        sec = GEMM_FLOOR + max(2 * m * n * k / GEMM_FLOPS, n * k * 2 / GEMM_WEIGHT_BW)
        rows.append(_row("gemm", "sglang_torch_linear", gemm_dtype="bfloat16", m=m, n=n,
                         k=k, latency=sec * 1e3))
    return rows


def _sizes() -> list[int]:
    return [2 ** i for i in range(8, 30, 3)]


def nccl_rows() -> list[dict]:
    rows = []
    for op, (lat, bw) in NCCL.items():
        for n, size in itertools.product((2, 4, 8), _sizes()):
            sec = lat * (1 + n / 16) + size / bw              # bytes = elements x 2 (half)
            rows.append({**_row(op, "NCCL", nccl_dtype="half", num_gpus=n,
                                message_size=size // 2, latency=sec * 1e3),
                         "framework": "TRTLLM", "version": "2.29.2"})
    return rows


def custom_ar_rows() -> list[dict]:
    rows = []
    for n, size, mode in itertools.product((2, 4, 8), _sizes(), ("graph", "eager")):
        lat, bw = CUSTOM_AR
        sec = (lat if mode == "graph" else 8 * lat) + size / bw
        rows.append(_row("all_reduce", f"SGLang_CustomAllReduce_{mode}",
                         allreduce_dtype="bfloat16", num_gpus=n, message_size=size // 2,
                         latency=sec * 1e3, backend=f"sglang_{mode}"))
    return rows


ROWS = {"generation_mla_perf": lambda: mla_rows(False),
        "context_mla_perf": lambda: mla_rows(True),
        "generation_attention_perf": lambda: attention_rows(False),
        "context_attention_perf": lambda: attention_rows(True),
        "gemm_perf": gemm_rows, "nccl_perf": nccl_rows, "custom_allreduce_perf": custom_ar_rows}


def write_table(path: Path, table: str, rows: list[dict], drop: tuple[str, ...] = ()) -> None:
    fields = [(c, t) for c, t in SCHEMAS[table] if c not in drop]
    schema = pa.schema(fields)
    data = {c: [r[c] for r in rows] for c, _ in fields}
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data, schema=schema), path)


def table_path(root: Path, table: str) -> Path:
    op, engine, version = PATHS[table]
    return root / "data" / SYSTEM / op / engine / version / f"{table}.parquet"


def make_systems(root: Path) -> Path:
    """Write the whole fixture under ``root`` (a systems directory) and return it."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{SYSTEM}.yaml").write_text(
        f"data_dir: data/{SYSTEM}\n"
        "gpu:\n  mem_bw: 6000000000000\n  mem_capacity: 100000000000\n"
        "  bfloat16_tc_flops: 2000000000000000\n  fp8_tc_flops: 4000000000000000\n"
        "node:\n  num_gpus_per_node: 8\n  intra_node_bw: 900000000000\n")
    for table, make in ROWS.items():
        write_table(table_path(root, table), table, make())
    return root
