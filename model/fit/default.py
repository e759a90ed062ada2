"""The embedded default model: fitted deterministically from the shipped measurements.

- ``b300_reference.csv``: the published 8 x B300 benchmark of Kimi-K3 (four times, two OOM
  points) under the assumptions ``model.fit.seedcheck`` chooses;
- ``h200_real.csv``: real vLLM 0.26.0 and SGLang 0.5.16 on one H200 (deepseek-v2-lite,
  llama-3.1-8b and qwen3-32b on both; random weights, contexts 1K-130K x batches 1-64).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from model.fit.costmodel import CostModel
from model.fit.dataset import Measurement, read_csv

DATA = Path(__file__).parents[1] / "data"
REFERENCE_CSV = DATA / "b300_reference.csv"
REAL_CSV = DATA / "h200_real.csv"


def real_rows() -> list[Measurement]:
    """The shipped real-engine measurements (``h200_real.csv``)."""
    return read_csv(REAL_CSV)


def shipped_rows() -> list[Measurement]:
    """Every shipped measurement, the default model's data (``model.validation.leave_model_out``
    leaves one model of them out)."""
    return read_csv(REFERENCE_CSV) + real_rows()


@lru_cache(maxsize=1)
def default_model() -> CostModel:
    rows = shipped_rows()
    model = CostModel.fit(rows, sources=[f"embedded:{REFERENCE_CSV.name}",
                                         f"embedded:{REAL_CSV.name}"])
    model.version = f"default-{model.data_sha256[:12]}"
    return model
