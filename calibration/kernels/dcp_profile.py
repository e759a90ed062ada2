"""Turn ``calibrate dcp`` measurements into a DCP profile (JSON) and its dataset (CSV).

Per backend (``ag``, ``a2a``) the profile fits what DCP adds to one layer step, ``latency *
log2(dcp) + received bytes / bandwidth + merge_per_elem * dcp * batch * heads``
(engine_advisor.model.hardware.profiles.eval_dcp_layer), plus a read curve of the split-KV attention
kernel. It records where DCP starts paying off (measured layer-step time with DCP below the
single-GPU full-context time) per batch size, and a hold-out check: a third of the layer-step points
predicted from fits on the rest.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from engine_advisor.model.diskio import atomic_write
from engine_advisor.model.hardware.gpus import BUILTIN_GPUS
from engine_advisor.model.hardware.profiles import (
    KIND_DCP,
    dcp_recv_bytes,
    eval_dcp_layer,
    eval_read_curve,
    fit_read_curve,
    geometric_crossover,
    gpu_key,
    median_rel_error,
)

REFERENCE = {"layers": 61, "heads": 128, "v_dim": 512, "kv_dim": 576, "kv_dtype": "bf16",
             "model": "DeepSeek-V3 / Kimi-K2 MLA: 61 layers, 128 query heads, latent 512 + 64"}
DEFAULT_BACKEND = "ag"    # the engines' default --dcp-comm-backend is ag_rs
KV_TOKEN_BYTES = 576 * 2
HOLDOUT_FRACTION = 1 / 3

# the raw measurement rows (engine_advisor.calibration.kernels.dcp_bench writes them; fitting needs
# no PyTorch)
DCP_COLUMNS = ("gpu", "kind", "backend", "dcp", "batch_size", "context_tokens", "q_heads",
               "message_bytes", "recv_bytes", "attn_s", "comm_s", "merge_s", "total_s",
               "dcp1_s", "timing", "note")


def _nnls_rel(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    w = 1.0 / y
    coef, _ = nnls(A * w[:, None], y * w)
    return coef


def fit_backend(steps: Sequence[dict], attn_curve: dict | None = None) -> dict:
    """What DCP adds to one layer step, for one backend, from its layer-step rows.

    Slopes from the component timings: ``comm_s = c0 + recv / bandwidth`` and
    ``merge_s = m0 + m1 * dcp * batch * heads``; the fixed part ``latency`` (per doubling of dcp)
    from the whole steps, as the median of (total - attention - slopes' share) / log2(dcp), so
    launch gaps and overlap inside a step are what was measured. With ``attn_curve`` the
    attention is the curve's (as when predicting), else the row's measured ``attn_s``.
    """
    d = np.array([r["dcp"] for r in steps], dtype=float)
    b = np.array([r["batch_size"] for r in steps], dtype=float)
    ctx = np.array([r["context_tokens"] for r in steps], dtype=float)
    heads = REFERENCE["heads"]
    backend = steps[0]["backend"]
    recv = dcp_recv_bytes(backend, d, b, heads, REFERENCE["v_dim"])
    comm = np.array([r["comm_s"] for r in steps])
    c0, inv_bw = _nnls_rel(np.column_stack([np.ones_like(d), recv]), comm)
    merge = np.array([r["merge_s"] for r in steps])
    m0, m1 = _nnls_rel(np.column_stack([np.ones_like(d), d * b * heads]), merge)
    if attn_curve is None:
        attn = np.array([r["attn_s"] for r in steps])
    else:
        attn = eval_read_curve(attn_curve, b * ctx / d * KV_TOKEN_BYTES)
    total = np.array([r["total_s"] for r in steps])
    fixed = (total - attn - recv * inv_bw - m1 * d * b * heads) / np.log2(d)
    return {"latency_s": float(max(np.median(fixed), 0.0)),
            "bandwidth_Bps": float(1.0 / inv_bw) if inv_bw > 0 else 1e15,
            "merge_s_per_elem": float(m1), "n_points": len(steps),
            "components": {"comm_fixed_s": float(c0), "merge_fixed_s": float(m0)}}


def attention_curve(rows: Sequence[dict]) -> dict:
    """Read curve of the split-KV MLA kernel from full-context (dcp1) and per-rank rows."""
    b, t = [], []
    for r in rows:
        if r["kind"] == "dcp1":
            b.append(r["batch_size"] * r["context_tokens"] * KV_TOKEN_BYTES)
            t.append(r["attn_s"])
        elif r["kind"] == "dcp_step":
            b.append(r["batch_size"] * r["context_tokens"] // r["dcp"] * KV_TOKEN_BYTES)
            t.append(r["attn_s"])
    return fit_read_curve(b, t)


def predict_step(profile_like: dict, backend: str, batch, ctx, dcp) -> np.ndarray:
    """Predicted seconds of one DCP layer step: split attention + comm + merge."""
    bsz = np.asarray(batch, dtype=float)
    c = np.asarray(ctx, dtype=float)
    d = np.asarray(dcp, dtype=float)
    attn = eval_read_curve(profile_like["attention_curve"], bsz * c / d * KV_TOKEN_BYTES)
    return attn + eval_dcp_layer(profile_like, backend, bsz, d)


def fit_all(rows: Sequence[dict]) -> dict:
    steps = [r for r in rows if r["kind"] == "dcp_step"]
    curve = attention_curve(rows)
    fits = {}
    for backend in sorted({r["backend"] for r in steps}):
        fits[backend] = fit_backend([r for r in steps if r["backend"] == backend], curve)
    return {"reference": REFERENCE, "fit": fits, "attention_curve": curve}


def holdout_check(rows: Sequence[dict], fraction: float = HOLDOUT_FRACTION,
                  seed: int = 0) -> dict:
    """Hold out ``fraction`` of the layer-step points; fit on the rest (their attention, comm and
    merge times, and the single-GPU rows); predict the held-out steps' total seconds."""
    steps = [r for r in rows if r["kind"] == "dcp_step"]
    if len(steps) < 6:
        raise ValueError("too few DCP layer-step points for a hold-out check")
    order = np.random.default_rng(seed).permutation(len(steps))
    n_test = max(1, int(round(len(steps) * fraction)))
    test = [steps[i] for i in order[:n_test]]
    train = [steps[i] for i in order[n_test:]] + [r for r in rows if r["kind"] == "dcp1"]
    fitted = fit_all(train)
    pred, obs = [], []
    for r in test:
        if r["backend"] not in fitted["fit"]:
            continue
        pred.append(float(predict_step(fitted, r["backend"], r["batch_size"],
                                       r["context_tokens"], r["dcp"])))
        obs.append(r["total_s"])
    med, mx = median_rel_error(pred, obs)
    return {"fraction": fraction, "seed": seed, "n_train": len(steps) - n_test,
            "n_test": len(pred), "median_rel_err": med, "max_rel_err": mx}


def crossovers(rows: Sequence[dict]) -> dict:
    """Per backend, dcp and batch: the context above which the measured DCP layer step beats
    the single-GPU full-context attention (None: DCP never paid off in the measured range;
    ``from_smallest``: it already paid off at the smallest context measured)."""
    out: dict = {}
    steps = [r for r in rows if r["kind"] == "dcp_step" and r["dcp1_s"] > 0]
    for backend in sorted({r["backend"] for r in steps}):
        for d in sorted({r["dcp"] for r in steps if r["backend"] == backend}):
            per = out.setdefault(backend, {}).setdefault(str(d), {})
            for batch in sorted({r["batch_size"] for r in steps}):
                rs = sorted((r for r in steps if r["backend"] == backend and r["dcp"] == d
                             and r["batch_size"] == batch), key=lambda r: r["context_tokens"])
                if len(rs) < 2:
                    continue
                x = np.array([r["context_tokens"] for r in rs], dtype=float)
                diff = np.array([r["total_s"] - r["dcp1_s"] for r in rs])
                cross = geometric_crossover(x, diff)
                per[str(batch)] = {
                    "crossover_context_tokens": int(round(cross)) if cross else None,
                    "pays_off_from_smallest": bool(diff[0] <= 0),
                    "speedup": {str(int(c)): float(r["dcp1_s"] / r["total_s"])
                                for c, r in zip(x, rs, strict=True)}}
    return out


def collective_fits(rows: Sequence[dict]) -> dict:
    out: dict = {}
    for r in rows:
        if r["kind"] != "collective":
            continue
        out.setdefault(r["backend"], {}).setdefault(str(r["dcp"]), []).append(r)
    fits: dict = {}
    for op, per_d in out.items():
        for d, rs in per_d.items():
            x = np.array([r["recv_bytes"] for r in rs], dtype=float)
            y = np.array([r["comm_s"] for r in rs])
            lat, inv = _nnls_rel(np.column_stack([np.ones_like(x), x]), y)
            fits.setdefault(op, {})[d] = {
                "latency_s": float(lat), "bandwidth_Bps": float(1 / inv) if inv > 0 else None,
                "points": [[int(r["message_bytes"]), int(r["recv_bytes"]), r["comm_s"]]
                           for r in rs]}
    return fits


def build_profile(data: dict, *, dataset_name: str, command: str,
                  gpu_name: str | None = None) -> dict:
    rows = data["rows"]
    if not any(r["kind"] == "dcp_step" for r in rows):
        raise ValueError("no DCP layer-step measurements: nothing to build a profile from")
    fitted = fit_all(rows)
    measured = sorted({r["dcp"] for r in rows if r["kind"] == "dcp_step"})
    return {
        "kind": KIND_DCP, "schema_version": 1,
        "gpu": data["gpu"], "gpu_key": gpu_key(gpu_name or data["gpu"], tuple(BUILTIN_GPUS)),
        "device": data.get("device", "cuda"), "world": data["world"],
        "dcp_sizes_measured": measured,
        "dcp_sizes_not_measured": [d for d in (2, 4, 8) if d not in measured],
        "software": data.get("software", {}),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command, "dataset": dataset_name, "config": data.get("config", {}),
        "default_backend": DEFAULT_BACKEND if DEFAULT_BACKEND in fitted["fit"]
        else sorted(fitted["fit"])[0],
        **fitted,
        "collectives": collective_fits(rows),
        "crossover": crossovers(rows),
        "holdout": holdout_check(rows),
        "check": data.get("checks", {}),
        "n_points": sum(1 for r in rows if r["kind"] == "dcp_step"),
    }


def write_profile(out: Path, data: dict, command: str, gpu_name: str | None = None) -> dict:
    from engine_advisor.calibration.kernels.gpu_profile import write_rows

    out = Path(out)
    csv_path = out.with_suffix(".csv")
    write_rows(csv_path, data["rows"], DCP_COLUMNS)
    prof = build_profile(data, dataset_name=csv_path.name, command=command, gpu_name=gpu_name)
    atomic_write(out, (json.dumps(prof, indent=1, allow_nan=False) + "\n").encode())
    return prof


def read_dataset(path: Path) -> list[dict]:
    """The rows of a committed DCP dataset CSV, numbers parsed."""
    import csv

    ints = ("dcp", "batch_size", "context_tokens", "q_heads", "message_bytes", "recv_bytes")
    floats = ("attn_s", "comm_s", "merge_s", "total_s", "dcp1_s")
    with Path(path).open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for c in ints:
            r[c] = int(float(r[c])) if r.get(c) not in (None, "") else 0
        for c in floats:
            r[c] = float(r[c]) if r.get(c) not in (None, "") else 0.0
    return rows


def summary(prof: dict) -> str:
    lines = [f"{prof['gpu']} ({prof['gpu_key']}) x {prof['world']}: DCP sizes measured "
             f"{prof['dcp_sizes_measured']}, not measured {prof['dcp_sizes_not_measured']}; "
             f"{prof['n_points']} layer-step points"]
    for backend, f in prof["fit"].items():
        lines.append(f"  {backend:3s}: adds {f['latency_s'] * 1e6:.1f} us per doubling of dcp + "
                     f"received bytes at {f['bandwidth_Bps'] / 1e9:.0f} GB/s + merge "
                     f"{f['merge_s_per_elem'] * 1e12:.0f} ps/elem per layer step")
    for backend, per_d in prof["crossover"].items():
        for d, per_b in per_d.items():
            parts = []
            for b, c in per_b.items():
                x = c["crossover_context_tokens"]
                parts.append(f"b{b}: " + (f"{x:,}" if x else ("< smallest"
                                                          if c["pays_off_from_smallest"]
                                                          else "never")))
            lines.append(f"  DCP {d} ({backend}) pays off above: " + ", ".join(parts))
    h = prof["holdout"]
    lines.append(f"hold-out ({h['n_test']} points): median error {h['median_rel_err']:.1%}, "
                 f"max {h['max_rel_err']:.1%}")
    for d, c in prof.get("check", {}).items():
        lines.append(f"  check dcp {d}: " + ", ".join(f"{b} rel err {v['rel_err']:.1e}"
                                                      for b, v in c.items()))
    return "\n".join(lines)
