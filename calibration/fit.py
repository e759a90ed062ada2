"""Fit the cost model from dataset files and summarise its quality."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model.artifact import check_name, save
from model.costmodel import MIN_CV_POINTS, CostModel
from model.dataset import Measurement, read_csv

DATASET_NAME = "dataset.csv"


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
    files = dataset_files(paths)
    rows: list[Measurement] = []
    for f in files:
        rows.extend(read_csv(f))
    return rows, [str(f) for f in files]


def fit_files(paths: list[str], out: str) -> tuple[CostModel, dict[str, Any]]:
    check_name(Path(out))
    rows, sources = read_all(paths)
    model = CostModel.fit(rows, sources=sources)
    meta = save(model, out)
    return model, meta


def format_fit_summary(model: CostModel, meta: dict[str, Any], out: str) -> str:
    lines = [f"{'engine/GPU':<14}{'points':>7}{'obs':>6}{'resid sd':>10}{'CV MAPE':>9}"
             "  calibrated configs"]
    for engine, m in sorted(model.metrics.items()):
        cv = m["cv_mape"]
        cfgs = sorted(k.split("/", 1)[1] for k in model.ranges if k.startswith(engine + "/"))
        lines.append(f"{engine:<14}{m['n_points']:>7}{m['n_observations']:>6}"
                     f"{m['residual_rel_std']:>10.1%}"
                     f"{(f'{cv:.1%}' if cv is not None else 'n/a'):>9}"
                     f"  {', '.join(cfgs)}")
    lines.append("")
    for warning in model.roofline_warnings:
        lines.append(f"warning: {warning}")
    lines.append("CV MAPE: leave-one-point-out error of each point's measured times "
                 f"(n/a below {MIN_CV_POINTS} points)")
    lines.append(f"wrote {out} (model {meta['model_version']}, data sha256 "
                 f"{meta['training_data_sha256'][:12]})")
    return "\n".join(lines)
