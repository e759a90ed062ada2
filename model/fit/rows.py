"""Dataset rows as one-row cases: which rows train the estimators, the served model of each
row, and the rows faster than their roofline."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine_advisor.model.engines.base import MemoryKnobs
from engine_advisor.model.fit.dataset import Measurement
from engine_advisor.model.hardware.gpus import builtin_gpu
from engine_advisor.model.hardware.silicon import silicon_for
from engine_advisor.model.physics.features import Case, roofline_total_s
from engine_advisor.model.physics.shape import ModelShape, shape_of


def gpu_or_none(name: str):
    try:
        return builtin_gpu(name)
    except KeyError:
        return None


def row_shape(r: Measurement) -> ModelShape:
    """The served model of a dataset row: its preset when the row names one, else the KV
    bytes alone (a bare shape)."""
    return shape_of(r.model, r.kv_cache_dtype, r.kv_bytes_per_token, r.kv_shards)


def row_case(r: Measurement, diversity: float = 1.0) -> Case:
    """A dataset row as a one-row case (``diversity``: its decode batch's routing diversity)."""
    gpu = gpu_or_none(r.gpu)
    if gpu is None:
        raise ValueError(f"row for GPU {r.gpu!r}: unknown GPU type (no physics known)")
    one = lambda v: np.array([float(v)])  # noqa: E731
    return Case(row_shape(r), silicon_for(gpu), r.num_gpus, np.array([r.engine]),
                one(r.batch_size), one(r.context_tokens), one(r.output_tokens), one(r.dcp_size),
                one(r.mem_fraction), float(r.prefix_share), diversity=float(diversity),
                knobs=MemoryKnobs(max_running=r.max_running or 0))


def roofline_check(rows: Sequence[Measurement]) -> list[str]:
    """A warning for every measured total faster than its roofline (spec-sheet peaks)."""
    out = []
    for r in rows:
        if not trainable(r) or r.total_s is None or gpu_or_none(r.gpu) is None:
            continue
        floor = float(roofline_total_s(row_case(r))[0])
        if r.total_s < floor:
            out.append(f"{r.engine} dcp {r.dcp_size} on {r.num_gpus} x {r.gpu}, "
                       f"{r.batch_size} x {r.context_tokens:,} + {r.output_tokens:,} tokens: "
                       f"measured {r.total_s:.3g} s is faster than its roofline {floor:.3g} s "
                       "(spec-sheet peaks): check the row's model, batch and units")
    return out


def trainable(r: Measurement) -> bool:
    """Rows the estimators train on: timed, and not an OOM or crash."""
    return not r.unsafe and r.timed
