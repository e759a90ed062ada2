"""The embedded default model: fitted deterministically from the shipped B300 reference data."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from model.costmodel import CostModel
from model.dataset import read_csv

REFERENCE_CSV = Path(__file__).parent / "data" / "b300_reference.csv"


@lru_cache(maxsize=1)
def default_model() -> CostModel:
    rows = read_csv(REFERENCE_CSV)
    model = CostModel.fit(rows, sources=[f"embedded:{REFERENCE_CSV.name}"])
    model.version = f"default-{model.data_sha256[:12]}"
    return model
