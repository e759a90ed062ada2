"""GPU profiles from aiconfigurator-core's measured per-operation tables: ``engine-advisor
calibrate import --format aiconfigurator --system S [--engine E] [--engine-version V] --out F``.

calibration/silicon/tables.py finds and reads the tables, calibration/silicon/physics.py turns
them into numbers (and documents how a table row maps to one GPU's call); this module assembles
the profile (schema 2, docs/silicon-profiles.md), writes it whole or not at all, and is the
command's handler.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

from engine_advisor.calibration.silicon.physics import (
    CTX_GQA_COLS,
    CTX_MLA_COLS,
    CUSTOM_AR_COLS,
    GEMM_COLS,
    GEMM_LARGE_M,
    GEMM_SMALL_M,
    GQA_COLS,
    MLA_COLS,
    MOE_COLS,
    NCCL_COLS,
    custom_all_reduce,
    gemm,
    gqa_decode,
    gqa_prefill,
    mla_decode,
    mla_prefill,
    moe_floor,
    nccl,
)
from engine_advisor.calibration.silicon.tables import (
    PACKAGE,
    SiliconError,
    System,
    TableRef,
    find_table,
    load_system,
    package_systems_dir,
    package_version,
    read_table,
)
from engine_advisor.model.hardware.profiles import KIND_GPU

SCHEMA_VERSION = 2


# --------------------------------------------------------------------------- the profile
def gpu_key(system: str) -> str:
    name = system.upper()
    return name[: -len("_SXM")] if name.endswith("_SXM") else name


class Importer:
    """Reads one system's tables for one engine and assembles the profile."""

    def __init__(self, system: System, engine: str, version: str | None):
        self.system, self.engine, self.version = system, engine, version
        self.tables: list[str] = []

    def read(self, op: str, table: str, cols: dict, engine: str | None = None,
             version: str | None = None) -> tuple[dict, TableRef]:
        ref = find_table(self.system, op, engine or self.engine, table,
                         self.version if engine is None else version)
        self.tables.append(ref.relative(self.system.root))
        return read_table(ref, cols, self.system.root), ref

    def build(self, command: str) -> dict:
        gpu_spec = self.system.spec.get("gpu") or {}
        node = self.system.spec.get("node") or {}
        spec_bw = gpu_spec.get("mem_bw")
        mla_t, mla_ref = self.read("mla", "generation_mla_perf", MLA_COLS)
        mla = mla_decode(mla_t, spec_bw)
        if "bf16" not in mla:
            raise SiliconError(f"--system: {mla_ref.relative(self.system.root)} has no bf16-KV "
                               "rows: the default KV-read curve (MLA decode, bf16) needs them")
        gqa = gqa_decode(self.read("attention", "generation_attention_perf", GQA_COLS)[0],
                         spec_bw)
        ctx_mla = mla_prefill(self.read("mla", "context_mla_perf", CTX_MLA_COLS)[0], self.engine)
        ctx_gqa = gqa_prefill(self.read("attention", "context_attention_perf",
                                        CTX_GQA_COLS)[0])
        gemms = gemm(self.read("gemm", "gemm_perf", GEMM_COLS)[0])
        coll = nccl(self.read("comm", "nccl_perf", NCCL_COLS, engine="nccl")[0])
        car = custom_all_reduce(self.read("comm", "custom_allreduce_perf", CUSTOM_AR_COLS)[0])
        if car:
            coll["custom_all_reduce"] = car
        moe = self.moe(spec_bw, mla_ref.version)
        kv = {k: v for k, v in mla["bf16"].items() if k != "by_heads"}
        device = str(mla_t["device"][0])
        return {
            "kind": KIND_GPU, "schema_version": SCHEMA_VERSION,
            "gpu": device, "gpu_key": gpu_key(self.system.name),
            "memory_bytes": gpu_spec.get("mem_capacity"), "spec_bandwidth_Bps": spec_bw,
            "spec": {"file": f"systems/{self.system.name}.yaml",
                     "bf16_flops": gpu_spec.get("bfloat16_tc_flops"),
                     "fp8_flops": gpu_spec.get("fp8_tc_flops"),
                     "fp4_flops": gpu_spec.get("fp4_tc_flops"),
                     "intra_node_Bps_one_way": node.get("intra_node_bw"),
                     "gpus_per_node": node.get("num_gpus_per_node")},
            "source": {"package": PACKAGE, "package_version": package_version(),
                       "system": self.system.name, "engine": self.engine,
                       "engine_version": mla_ref.version, "device": device,
                       "tables": self.tables,
                       "timing": "CUDA graph replays back to back, mean per call, one layer",
                       "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                       "command": command},
            "kv_read": {**kv, "family": "mla/bf16"},
            "attention": {"mla": mla, "gqa": gqa},
            "context_attention": {"mla": ctx_mla, "gqa": ctx_gqa},
            "gemm": gemms,
            "collectives": coll,
            **({"moe_call": moe} if moe else {}),
        }

    def moe(self, spec_bw: float | None, version: str) -> dict:
        """The fused-MoE call's floor per experts' format (``moe_floor``), from the MoE table
        of the version the attention tables came from; {} where the system has none."""
        try:
            t, _ = self.read("moe", "moe_perf", MOE_COLS, engine=self.engine,
                             version=self.version or version)
        except SiliconError:
            return {}
        return moe_floor(t, spec_bw)


def build_profile(system: str, engine: str = "sglang", version: str | None = None,
                  systems_dir: str | Path | None = None, command: str = "") -> dict:
    root = Path(systems_dir) if systems_dir else package_systems_dir()
    return Importer(load_system(root, system), engine, version or None).build(command)


def write_profile(out: Path, profile: dict) -> None:
    """Write atomically: a failed write leaves any existing file as it was."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(profile, indent=1, allow_nan=False) + "\n")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def summary(p: dict) -> str:
    kv, spec = p["kv_read"], p.get("spec_bandwidth_Bps")
    lines = [f"{p['gpu']} ({p['gpu_key']}) from {p['source']['package']} "
             f"{p['source']['package_version']}, {p['source']['engine']} "
             f"{p['source']['engine_version']}, {len(p['source']['tables'])} tables",
             f"KV read (MLA decode bf16, {kv['kernel']}, heads/GPU {kv['heads_per_gpu']}): "
             f"asymptotic {kv['asymptotic_Bps'] / 1e12:.2f} TB/s"
             + (f" = {kv['asymptotic_Bps'] / spec:.0%} of spec" if spec else "")
             + f", per-call floor {kv['overhead_s'] * 1e6:.1f} us"]
    for fam, by in p["attention"].items():
        for d, c in by.items():
            lines.append(f"  decode {fam}/{d} ({c['kernel']}): peak {c['peak_Bps'] / 1e12:.2f} "
                         f"TB/s, {c['n_points']} points")
    for fam, by in p["context_attention"].items():
        for d, c in by.items():
            lines.append(f"  prefill {fam}/{d} ({c['kernel']}): "
                         f"{c['achievable_flops'] / 1e12:.0f} TFLOP/s median")
    for d, g in p["gemm"].items():
        f = f"{g['achievable_flops'] / 1e12:.0f} TFLOP/s" if g["achievable_flops"] else "-"
        w = f"{g['weight_read_Bps'] / 1e12:.2f} TB/s" if g["weight_read_Bps"] else "-"
        lines.append(f"  gemm {d}: {f} (M >= {GEMM_LARGE_M}), weights {w} (M <= {GEMM_SMALL_M})")
    for op, by in p["collectives"].items():
        sizes = ", ".join(f"{n}: {c['latency_s'] * 1e6:.1f} us + "
                          f"{(c['bandwidth_Bps'] or 0) / 1e9:.0f} GB/s"
                          for n, c in by.items() if n != "kernel")
        lines.append(f"  {op}: {sizes}")
    for d, m in (p.get("moe_call") or {}).items():
        lines.append(f"  fused MoE {d}: floor {m['base_s'] * 1e6:.1f} us + "
                     f"{m['per_expert_s'] * 1e9:.0f} ns per expert ({m['experts_range'][0]}-"
                     f"{m['experts_range'][1]} experts, {m['n_shapes']} shapes, median error "
                     f"{m['median_rel_error']:.0%})")
    return "\n".join(lines)
