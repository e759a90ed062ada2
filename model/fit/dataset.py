"""The calibration dataset: one row per measured point, CSV on disk.

Lives in ``model`` (not ``calibration``) because the embedded default model is fitted from the
shipped reference rows and ``model`` imports nothing above it; ``calibration`` produces rows.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine_advisor.model import engines
from engine_advisor.model.diskio import atomic_write

COLUMNS = ("engine", "engine_version", "gpu", "num_gpus", "dcp_size", "mem_fraction",
           "context_tokens", "output_tokens", "batch_size", "kv_bytes_per_token", "kv_shards",
           "ttft_s", "tpot_s", "total_s", "oom_retries", "errors", "source", "model",
           "kv_cache_dtype", "prefix_share", "decode_step_s", "kv_capacity_tokens", "weights",
           "max_running")

OptPosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)] | None
# the source of a row that ``calibrate run`` measured from the point's token streams
SWEEP_SOURCE = "calibrate:"


class Measurement(BaseModel):
    """One measured point. Times are optional: a failed launch or OOM is a point too.

    The times the cost model is fitted on, each what it predicts:

    - ``total_s``: wall time of the whole batch (first request sent -> last token);
    - ``ttft_s``: the batch's prefill, first request sent -> last first token (at batch 1 the
      request's TTFT);
    - ``decode_step_s``: one decode step of the whole batch with no prefill in it
      (``engine_advisor.calibration.sweep.streams``).

    ``tpot_s`` is the engines' own TPOT, ``(e2e - ttft) / (output - 1)`` averaged over requests:
    with all requests sent at once it mixes other requests' prefill into the decode steps, so it
    is kept for comparison and not fitted. ``kv_capacity_tokens`` is the KV capacity the engine
    reported in this configuration; ``weights`` says whether it served a checkpoint (``real``)
    or random weights (``dummy``: ``--load-format dummy``); ``max_running`` the running-request
    limit the engine was launched with (vLLM ``--max-num-seqs``, SGLang
    ``--max-running-requests``; empty: the engine's default), which decides how many of a
    batch run at once as the KV and state pools do.
    """

    model_config = ConfigDict(extra="forbid")

    engine: str
    engine_version: str = ""
    gpu: Annotated[str, Field(min_length=1)]
    num_gpus: Annotated[int, Field(gt=0, le=1024)]
    dcp_size: Annotated[int, Field(gt=0, le=1024)] = 1
    mem_fraction: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
    context_tokens: Annotated[int, Field(gt=0)]
    output_tokens: Annotated[int, Field(gt=0)]
    batch_size: Annotated[int, Field(gt=0)]
    kv_bytes_per_token: Annotated[int, Field(gt=0)]
    kv_shards: Annotated[int, Field(gt=0)] = 1
    ttft_s: OptPosFloat = None
    tpot_s: OptPosFloat = None
    total_s: OptPosFloat = None
    oom_retries: Annotated[int, Field(ge=0)] = 0
    errors: Annotated[int, Field(ge=0)] = 0
    source: str = ""
    # the served model: a preset name (its architecture gives the physics) or any other name
    # (then only kv_bytes_per_token is known); the KV dtype and the prompts' prefix-cache share
    model: Annotated[str, Field(max_length=256)] = ""
    kv_cache_dtype: Literal["bf16", "fp16", "fp8"] = "bf16"
    prefix_share: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.0
    decode_step_s: OptPosFloat = None
    kv_capacity_tokens: Annotated[int, Field(gt=0)] | None = None
    weights: Literal["real", "dummy"] = "real"
    max_running: Annotated[int, Field(gt=0)] | None = None

    @field_validator("engine")
    @classmethod
    def _engine(cls, v: str) -> str:
        if v not in engines.REGISTRY:
            raise ValueError(f"unknown engine {v!r}; expected one of {engines.names()}")
        return v

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, v: str) -> str:
        return v.upper()

    @property
    def decode_step(self) -> float | None:
        """One decode step of the whole batch, as the row states it: ``decode_step_s``, or at
        batch 1 the engines' TPOT (the same thing there) where the row carries no token
        streams (an imported summary, a published figure). A sweep's row without one had
        streams that showed none (``engine_advisor.calibration.sweep.streams``: outputs that
        arrived in a few chunks, as vLLM streamed a 260,000-token prompt's 128 tokens in three):
        its TPOT then measures the server's front end, not a step."""
        if self.decode_step_s is not None or self.source.startswith(SWEEP_SOURCE):
            return self.decode_step_s
        return self.tpot_s if self.batch_size == 1 else None

    @property
    def unsafe(self) -> bool:
        """The point saw out-of-memory retries or failed outright."""
        return self.oom_retries > 0 or (self.timed is False and self.errors > 0)

    @property
    def timed(self) -> bool:
        """Some time was measured (total, prefill, decode step or the engines' TPOT)."""
        return any(v is not None for v in (self.total_s, self.ttft_s, self.decode_step_s,
                                           self.tpot_s))


class DatasetError(ValueError):
    def __init__(self, path: str, line: int, message: str):
        super().__init__(f"{path}:{line}: {message}")
        self.path, self.line = path, line


def _cell(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    return str(v)


def row_csv(m: Measurement) -> str:
    """One CSV line (with newline) for ``m`` in COLUMNS order."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([_cell(getattr(m, c)) for c in COLUMNS])
    return buf.getvalue()


def header_csv() -> str:
    return ",".join(COLUMNS) + "\n"


def parse_csv(text: str, path: str = "<data>") -> list[Measurement]:
    """Parse dataset CSV text; lines starting with '#' are comments. Errors name file and line."""
    lines = text.splitlines()
    body = [(i + 1, ln) for i, ln in enumerate(lines)
            if ln.strip() and not ln.lstrip().startswith("#")]
    if not body:
        raise DatasetError(path, 1, "empty dataset (no header)")
    hline, header = body[0]
    cols = next(csv.reader([header]))
    missing = [c for c in COLUMNS if c not in cols and Measurement.model_fields[c].is_required()]
    if missing:
        raise DatasetError(path, hline, f"header lacks required columns {missing}")
    unknown = [c for c in cols if c not in COLUMNS]
    if unknown:
        raise DatasetError(path, hline, f"unknown columns {unknown}")
    rows = []
    for lineno, ln in body[1:]:
        cells = next(csv.reader([ln]))
        if len(cells) != len(cols):
            raise DatasetError(path, lineno, f"expected {len(cols)} cells, got {len(cells)}")
        data = {c: v for c, v in zip(cols, cells, strict=True) if v != ""}
        try:
            rows.append(Measurement.model_validate(data))
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err["loc"]) or "row"
            raise DatasetError(path, lineno, f"{field}: {err['msg']}") from None
    return rows


def read_csv(path: str | Path) -> list[Measurement]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise DatasetError(str(p), 0, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise DatasetError(str(p), 0, "not UTF-8 text") from None
    return parse_csv(text, str(p))


def write_csv(path: str | Path, rows: Iterable[Measurement]) -> None:
    """The rows as a dataset CSV at ``path``, written whole or not at all."""
    atomic_write(Path(path), (header_csv() + "".join(row_csv(r) for r in rows)).encode())


def dataset_sha256(rows: Iterable[Measurement]) -> str:
    h = hashlib.sha256(header_csv().encode())
    for r in rows:
        h.update(row_csv(r).encode())
    return h.hexdigest()
