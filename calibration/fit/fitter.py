"""Fit the cost model from dataset files, guard what it writes, and summarise its quality.

Before fitting, every row must name its served model's architecture (a preset, or an ``hf:`` key
whose config.json lives beside the dataset: ``engine_advisor.calibration.sweep.served_model``),
unless the user asks for a fit on KV bytes alone (``kv_bytes_only``). After fitting, the artifact is
written only if the fit means something (``guard``): not when most rows are faster than their
roofline (the physics at spec-sheet peaks), and not when the held-out error is absurd. A run of
``engine-advisor sim`` at a time scale below 1 is named as the cause: it runs the hidden truth
faster than any GPU can.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.model.fit.artifact import check_name, save
from engine_advisor.model.fit.costmodel import MIN_CV_POINTS, CostModel
from engine_advisor.model.fit.dataset import Measurement, read_csv
from engine_advisor.model.fit.rows import trainable
from engine_advisor.model.physics.shape import register_row_config

DATASET_NAME = "dataset.csv"
MANIFEST_NAME = "manifest.json"
ABSURD_HELD_OUT = 0.5       # a level whose median held-out error is above 50 % explains nothing


class FitRefused(CalibrationError, ValueError):
    """The fit would mean nothing; the message names the cause and the way out."""


def dataset_files(paths: list[str]) -> list[Path]:
    """CSV files named directly, or ``dataset.csv`` inside run folders."""
    out = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            f = p / DATASET_NAME
            if not f.is_file():
                raise ValueError(f"{p}: a folder without {DATASET_NAME}")
            out.append(f)
        elif p.is_file():
            out.append(p)
        else:
            raise ValueError(f"{p}: no such file or folder")
    return out


def read_all(paths: list[str]) -> tuple[list[Measurement], list[str]]:
    """The rows of every dataset, with the ``hf:`` architectures they name registered
    (``engine_advisor.model.physics.shape.register_row_config``) from the configs stored beside
    them."""
    from engine_advisor.calibration.sweep.served_model import resolve_row_config

    files = dataset_files(paths)
    rows: list[Measurement] = []
    for f in files:
        file_rows = read_csv(f)
        for key in sorted({r.model for r in file_rows if r.model.startswith("hf:")}):
            register_row_config(key, resolve_row_config(f, key))
        rows.extend(file_rows)
    return rows, [str(f) for f in files]


def sim_time_scales(files: list[str]) -> list[float]:
    """Time scales of ``engine-advisor sim`` runs the datasets' manifests recorded."""
    out = []
    for f in files:
        manifest = Path(f).with_name(MANIFEST_NAME)
        try:
            engines = json.loads(manifest.read_text()).get("engines", {})
        except (OSError, ValueError, AttributeError):
            continue
        for info in engines.values() if isinstance(engines, dict) else ():
            res = info.get("sim_time_resolution") if isinstance(info, dict) else None
            if isinstance(res, dict) and isinstance(res.get("time_scale"), int | float):
                out.append(float(res["time_scale"]))
    return out


def check_architecture(rows: list[Measurement], kv_bytes_only: bool) -> None:
    """Refuse rows that name no architecture, naming them, unless ``kv_bytes_only``."""
    bare = [r for r in rows if trainable(r) and not r.model]
    if bare and not kv_bytes_only:
        shown = ", ".join(f"{r.engine} {r.context_tokens} x {r.batch_size}" for r in bare[:5])
        more = f" and {len(bare) - 5} more" if len(bare) > 5 else ""
        raise FitRefused(
            f"{len(bare)} rows name no served model's architecture ({shown}{more}): their "
            "weights and FLOPs are unknown. Record it (calibrate run --preset NAME or "
            "--hf-config FILE, or calibrate rebuild), or fit with --kv-bytes-only to fit on "
            "KV bytes alone")


def guard(model: CostModel, rows: list[Measurement], files: list[str]) -> None:
    """Refuse a fit that means nothing (module docstring)."""
    timed = [r for r in rows if trainable(r) and r.total_s is not None]
    scales = [s for s in sim_time_scales(files) if s < 1.0]
    slow_sim = (f"; the simulator ran at time scale {min(scales):g}: it plays its cost model "
                f"{1 / min(scales):g}x faster than the physics, use a time scale of 1 or more "
                "to calibrate (docs/simulator.md)") if scales else ""
    fast = len(model.roofline_warnings)
    if timed and fast > len(timed) / 2:
        raise FitRefused(f"{fast} of {len(timed)} timed rows are faster than their roofline "
                         f"(the physics at spec-sheet peaks){slow_sim}; check the rows' model, "
                         "GPU, batch and units, or fit --force to write it anyway")
    absurd = {k: m["held_out_median"] for k, m in model.metrics.items()
              if m.get("held_out_median") is not None and m["n_points"] >= MIN_CV_POINTS
              and m["held_out_median"] > ABSURD_HELD_OUT}
    if absurd:
        worst = ", ".join(f"{k} {v:.0%}" for k, v in sorted(absurd.items()))
        raise FitRefused(f"the held-out error is absurd ({worst} median): the terms cannot "
                         f"explain these rows{slow_sim}; fit --force to write it anyway")


def fit_files(paths: list[str], out: str, *, kv_bytes_only: bool = False,
              force: bool = False) -> tuple[CostModel, dict[str, Any]]:
    check_name(Path(out))
    rows, sources = read_all(paths)
    check_architecture(rows, kv_bytes_only)
    model = CostModel.fit(rows, sources=sources)
    if not force:
        guard(model, rows, sources)
    meta = save(model, out)
    return model, meta


def format_fit_summary(model: CostModel, meta: dict[str, Any], out: str) -> str:
    """Per pooling level: points, observations, median held-out error next to the prior's
    on the same points, the 90 % half-width, the terms the data moved."""
    import math

    lines = [f"{'level':<18}{'points':>7}{'obs':>6}{'held out':>10}{'prior':>8}"
             f"{'90% ±':>8}  terms moved"]
    for key, m in sorted(model.metrics.items()):
        def pct(v: float | None) -> str:
            return f"{v:.1%}" if v is not None else "n/a"
        hw = m.get("interval_halfwidth")
        lines.append(f"{key:<18}{m['n_points']:>7}{m['n_observations']:>6}"
                     f"{pct(m.get('held_out_median')):>10}{pct(m.get('prior_median')):>8}"
                     f"{pct(math.expm1(hw) if hw is not None else None):>8}  "
                     f"{', '.join(m.get('free') or []) or 'none (the prior holds)'}")
    lines.append("")
    for engine, by_model in sorted(model.diversity.items()):
        for name, rho in sorted(by_model.items()):
            lines.append(f"note: {engine}'s random-weight rows of {name} route a decode batch "
                         f"with diversity {rho:g} (1 = a trained router); its routed experts' "
                         "decode efficiency stays at the prior, which such rows cannot inform")
    for warning in model.roofline_warnings:
        lines.append(f"warning: {warning}")
    lines.append("held out: median error of each point predicted by a fit without it; prior: "
                 f"the uncalibrated model on the same points (fewer than {MIN_CV_POINTS} "
                 "points: nothing to hold out but each point itself)")
    lines.append(f"wrote {out} (model {meta['model_version']}, data sha256 "
                 f"{meta['training_data_sha256'][:12]})")
    return "\n".join(lines)
