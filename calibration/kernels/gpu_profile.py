"""Turn ``calibrate gpu`` measurements into a hardware profile (JSON) and its dataset (CSV).

The profile holds, per KV shape, a monotone read curve t(bytes)
(engine_advisor.model.hardware.profiles), a pooled ``kv_read`` curve over the fused GQA attention
rows (what the cost model uses as its physics), plain HBM read bandwidth, the per-call overheads,
and a hold-out check: a third of the attention points predicted from curves fitted on the rest.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine_advisor.model.diskio import atomic_write
from engine_advisor.model.hardware.gpus import BUILTIN_GPUS
from engine_advisor.model.hardware.profiles import (
    KIND_GPU,
    eval_read_curve,
    fit_read_curve,
    gpu_key,
    median_rel_error,
)

INT_COLS = ("batch_size", "context_tokens", "q_heads", "kv_heads", "head_dim", "v_dim",
            "bytes_read", "calls_per_replay")
FLOAT_COLS = ("flops", "seconds", "seconds_min", "seconds_max", "bandwidth_Bps")
HOLDOUT_FRACTION = 1 / 3
KV_READ_IMPL = "sdpa"   # fused kernels (PyTorch SDPA) define the KV-read physics

# the raw measurement rows (engine_advisor.calibration.kernels.gpu_bench writes them; fitting needs
# no PyTorch)
ROW_COLUMNS = ("gpu", "kind", "shape", "impl", "dtype", "batch_size", "context_tokens", "q_heads",
               "kv_heads", "head_dim", "v_dim", "bytes_read", "flops", "seconds", "seconds_min",
               "seconds_max", "calls_per_replay", "timing", "bandwidth_Bps", "note")


def write_rows(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """The rows as a CSV at ``path``, written whole or not at all (``atomic_write``)."""
    fh = io.StringIO(newline="")
    w = csv.DictWriter(fh, fieldnames=list(columns), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: _fmt(r.get(c, "")) for c in columns})
    atomic_write(Path(path), fh.getvalue().encode())


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.6g}" if v else "0"
    return v


def read_rows(path: Path) -> list[dict]:
    with Path(path).open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for c in INT_COLS:
            if c in r and r[c] != "":
                r[c] = int(float(r[c]))
        for c in FLOAT_COLS:
            if c in r and r[c] != "":
                r[c] = float(r[c])
    return rows


def attention_rows(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r["kind"] == "attention"]


def _family(r: dict) -> str:
    return f"{r['shape']}/{r['dtype']}"


def _floor(rows: Sequence[dict], family: str) -> float | None:
    """The measured per-call floor of a shape (attention over 16 tokens), if any."""
    shape = family.split("/")[0]
    vals = [r["seconds"] for r in rows if r["kind"] == "overhead" and r["shape"] == shape]
    return min(vals) if vals else None


def fit_family_curves(rows: Sequence[dict], overhead_rows: Sequence[dict] = ()) -> dict[str, dict]:
    """A read curve per (shape, dtype) family of attention rows."""
    fams: dict[str, list[dict]] = {}
    for r in attention_rows(rows):
        fams.setdefault(_family(r), []).append(r)
    curves = {}
    for fam, rs in sorted(fams.items()):
        if len(rs) < 2:
            continue
        curves[fam] = fit_read_curve([r["bytes_read"] for r in rs], [r["seconds"] for r in rs],
                                     _floor(overhead_rows, fam))
    return curves


def holdout_check(rows: Sequence[dict], fraction: float = HOLDOUT_FRACTION,
                  seed: int = 0) -> dict:
    """Hold out ``fraction`` of the attention points (random, seeded), fit the per-shape curves
    on the rest, predict the held-out times. Returns the median and max relative error."""
    att = attention_rows(rows)
    if len(att) < 6:
        raise ValueError("too few attention points for a hold-out check")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(att))
    n_test = max(1, int(round(len(att) * fraction)))
    test = [att[i] for i in order[:n_test]]
    train = [att[i] for i in order[n_test:]]
    over = [r for r in rows if r["kind"] == "overhead"]
    curves = fit_family_curves(train, over)
    pred, obs, worst = [], [], None
    for r in test:
        curve = curves.get(_family(r))
        if curve is None:
            continue
        p = float(eval_read_curve(curve, [r["bytes_read"]])[0])
        pred.append(p)
        obs.append(r["seconds"])
        e = abs(p - r["seconds"]) / r["seconds"]
        if worst is None or e > worst[0]:
            worst = (e, f"{r['shape']} {r['dtype']} b{r['batch_size']} ctx{r['context_tokens']}")
    med, mx = median_rel_error(pred, obs)
    return {"fraction": fraction, "seed": seed, "n_train": len(train), "n_test": len(pred),
            "median_rel_err": med, "max_rel_err": mx, "worst_point": worst[1] if worst else ""}


def build_profile(rows: Sequence[dict], meta: dict, *, dataset_name: str, command: str,
                  gpu_name: str | None = None) -> dict:
    key = gpu_key(gpu_name or meta["gpu"], tuple(BUILTIN_GPUS))
    spec = BUILTIN_GPUS.get(key)
    spec_bw = spec.hbm_bandwidth if spec else None
    att = attention_rows(rows)
    if len(att) < 2:
        raise ValueError("no attention measurements: nothing to build a profile from")
    over = [r for r in rows if r["kind"] == "overhead"]

    def frac(bps: float) -> float | None:
        return bps / spec_bw if spec_bw else None

    shapes = {}
    for fam, curve in fit_family_curves(rows, over).items():
        rs = [r for r in att if _family(r) == fam]
        peak = max(r["bandwidth_Bps"] for r in rs)
        shapes[fam] = {"curve": curve, "n_points": len(rs), "peak_Bps": peak,
                       "peak_fraction_of_spec": frac(peak),
                       "asymptotic_fraction_of_spec": frac(curve["asymptotic_Bps"])}
    gqa = [r for r in att if r["impl"] == KV_READ_IMPL and r["dtype"] == "bf16"] or att
    kv_curve = fit_read_curve([r["bytes_read"] for r in gqa], [r["seconds"] for r in gqa],
                              min((r["seconds"] for r in over if r["impl"] == KV_READ_IMPL),
                                  default=None))
    kb = np.asarray(kv_curve["bytes"])
    eff = (kb / eval_read_curve(kv_curve, kb)).tolist()
    hbm = [r for r in rows if r["kind"] == "hbm_read"]
    hbm_out = None
    if hbm:
        hcurve = fit_read_curve([r["bytes_read"] for r in hbm], [r["seconds"] for r in hbm])
        peak = max(r["bandwidth_Bps"] for r in hbm)
        hbm_out = {"curve": hcurve, "peak_Bps": peak, "peak_fraction_of_spec": frac(peak),
                   "points": [[r["bytes_read"], r["bandwidth_Bps"]] for r in hbm]}
    copy = [r for r in rows if r["kind"] == "copy"]
    overhead = {r["shape"]: r["seconds"] for r in over}
    n_shapes = len({r["shape"] for r in att})
    return {
        "kind": KIND_GPU, "schema_version": 1,
        "gpu": meta["gpu"], "gpu_key": key, "memory_bytes": meta["memory_bytes"],
        "sm_count": meta.get("sm_count"), "l2_bytes": meta.get("l2_bytes"),
        "spec_bandwidth_Bps": spec_bw,
        "software": meta["software"],
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command, "dataset": dataset_name,
        "grid": {**meta["grid"], "skipped": meta.get("skipped", [])},
        "n_points": len(att), "n_shapes": n_shapes,
        "overhead": overhead,
        "kv_read": {**kv_curve, "shapes": sorted({r["shape"] for r in gqa}),
                    "asymptotic_fraction_of_spec": frac(kv_curve["asymptotic_Bps"])},
        "effective_bandwidth": {"bytes": kv_curve["bytes"], "Bps": eff,
                                "fraction_of_spec": [frac(e) for e in eff] if spec_bw else None},
        "hbm_read": hbm_out,
        "copy_Bps_read_plus_write": copy[0]["bandwidth_Bps"] if copy else None,
        "shapes": shapes,
        "holdout": holdout_check(rows),
        "mla_kernel": {"config": meta.get("mla_config"), "tuning": meta.get("mla_tuning"),
                       "check": meta.get("mla_check")},
    }


def write_profile(out: Path, rows: Sequence[dict], meta: dict, command: str,
                  gpu_name: str | None = None) -> dict:
    out = Path(out)
    csv_path = out.with_suffix(".csv")
    write_rows(csv_path, rows, ROW_COLUMNS)
    prof = build_profile(rows, meta, dataset_name=csv_path.name, command=command,
                         gpu_name=gpu_name)
    atomic_write(out, (json.dumps(prof, indent=1, allow_nan=False) + "\n").encode())
    return prof


def summary(prof: dict) -> str:
    lines = [f"{prof['gpu']} ({prof['gpu_key']}): {prof['n_points']} attention points over "
             f"{prof['n_shapes']} KV shapes"]
    spec = prof.get("spec_bandwidth_Bps")
    if prof.get("hbm_read"):
        h = prof["hbm_read"]
        lines.append(f"HBM read peak {h['peak_Bps'] / 1e12:.2f} TB/s"
                     + (f" = {h['peak_fraction_of_spec']:.0%} of the {spec / 1e12:.1f} TB/s spec"
                        if spec else ""))
    kv = prof["kv_read"]
    lines.append(f"KV read (fused attention) asymptotic {kv['asymptotic_Bps'] / 1e12:.2f} TB/s"
                 + (f" = {kv['asymptotic_fraction_of_spec']:.0%} of spec" if spec else "")
                 + f", per-call floor {kv['overhead_s'] * 1e6:.1f} us")
    for fam, s in prof["shapes"].items():
        lines.append(f"  {fam:18s} {s['n_points']:3d} points, peak {s['peak_Bps'] / 1e12:.2f} "
                     f"TB/s" + (f" ({s['peak_fraction_of_spec']:.0%})" if spec else ""))
    h = prof["holdout"]
    lines.append(f"hold-out ({h['n_test']} of {h['n_test'] + h['n_train']} points): median error "
                 f"{h['median_rel_err']:.1%}, max {h['max_rel_err']:.1%} ({h['worst_point']})")
    return "\n".join(lines)
