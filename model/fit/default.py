"""The embedded default model: fitted deterministically from the shipped measurements.

- ``b300_reference.csv``: the published 8 x B300 benchmark of Kimi-K3 (four times, two OOM
  points) under the assumptions ``engine_advisor.model.fit.seedcheck`` chooses;
- ``h200_real.csv``: real vLLM 0.26.0 and SGLang 0.5.16 on one H200 (deepseek-v2-lite,
  llama-3.1-8b and qwen3-32b on both, contexts 1K-130K x batches 1-64; random weights).

``h200_real_unfitted.csv`` (two more MoEs and two hybrids on both engines) is measured the same
way and checks the model left out (``left_out_rows``).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.dataset import Measurement, read_csv

DATA = Path(__file__).parents[1] / "data"
REFERENCE_CSV = DATA / "b300_reference.csv"
REAL_CSV = DATA / "h200_real.csv"
UNFITTED_CSV = DATA / "h200_real_unfitted.csv"


def real_rows() -> list[Measurement]:
    """The shipped real-engine measurements (``h200_real.csv``)."""
    return read_csv(REAL_CSV)


def unfitted_rows() -> list[Measurement]:
    """Real-engine measurements shipped but not fitted on (``h200_real_unfitted.csv``: its
    header and ``bench/real_engines/rebuild_real.py`` say why), for validation."""
    return read_csv(UNFITTED_CSV)


# Models whose real runs are checked left out of the data (``left_out_rows``): a dense model and
# a hybrid the fit also uses, and models shipped unfitted (``h200_real_unfitted.csv``)
LEFT_OUT = ("qwen3-32b", "qwen3-30b-a3b", "mixtral-8x7b", "nemotron-3-nano-30b-a3b",
            "qwen3-next-80b-a3b-fp8")


def left_out_rows(name: str) -> list[Measurement]:
    """The default model's data and the unfitted real-engine rows of model ``name``: what
    ``engine_advisor.model.validation.leave_model_out`` takes to check ``name`` against a fit on the
    others."""
    return fitted_rows() + [r for r in unfitted_rows() if r.model == name]


def fitted_rows() -> list[Measurement]:
    """The default model's data: the B300 seed and ``h200_real.csv``."""
    return read_csv(REFERENCE_CSV) + real_rows()


@lru_cache(maxsize=1)
def default_model() -> CostModel:
    rows = fitted_rows()
    model = CostModel.fit(rows, sources=[f"embedded:{REFERENCE_CSV.name}",
                                         f"embedded:{REAL_CSV.name}"])
    model.version = f"default-{model.data_sha256[:12]}"
    return model
