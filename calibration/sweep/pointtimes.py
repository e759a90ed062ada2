"""A point's dataset times from its successful requests: what ``calibrate run`` records and
``calibrate rebuild`` re-derives from ``samples.jsonl``.

- ``ttft_s``: the batch's prefill, first request sent -> last first token (``streams``);
- ``decode_step_s``: the median inter-token gap in the window where every request has its
  first token and none has finished (``streams``); at batch 1 the request's median ITL;
- ``tpot_s``: the engines' TPOT, ``(e2e - ttft) / (output - 1)`` averaged over requests, kept
  for comparison (it mixes other requests' prefill into the decode steps);
- ``total_s``: the batch's wall time (measured around the batch) when every request succeeded,
  else the last successful request's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine_advisor.calibration.sweep.streams import Stream, stream_times


@dataclass(frozen=True)
class RequestTimes:
    """One successful request, seconds; ``start_s`` from the batch start."""

    start_s: float
    ttft_s: float
    e2e_s: float
    itl_s: tuple[float, ...]
    tpot_s: float | None = None

    @classmethod
    def of(cls, s: Any) -> RequestTimes:
        """From a ``client.Sample`` or its ``samples.jsonl`` record."""
        get = s.get if isinstance(s, dict) else lambda k: getattr(s, k)
        return cls(float(get("start_s") or 0.0), float(get("ttft_s")), float(get("e2e_s")),
                   tuple(float(x) for x in get("itl_s") or ()),
                   None if get("tpot_s") is None else float(get("tpot_s")))


@dataclass(frozen=True)
class PointTimes:
    ttft_s: float | None
    tpot_s: float | None
    total_s: float | None
    decode_step_s: float | None
    decode_steps: int = 0
    decode_context: float | None = None


def point_times(requests: Sequence[RequestTimes], *, batch_size: int, prompt_tokens: int,
                wall_s: float | None = None) -> PointTimes:
    """The point's times (module docstring); ``wall_s``: the batch's measured wall time."""
    if not requests:
        return PointTimes(None, None, None, None)
    st = stream_times([Stream.of(r.start_s, r.ttft_s, r.itl_s) for r in requests],
                      prompt_tokens)
    tpots = [r.tpot_s for r in requests if r.tpot_s is not None]
    tpot = sum(tpots) / len(tpots) if tpots else None
    last_end = max(r.start_s + r.e2e_s for r in requests)
    total = wall_s if wall_s is not None and len(requests) == batch_size else last_end
    return PointTimes(st.prefill_s, tpot, total, st.decode_step_s, st.decode_steps,
                      st.decode_context)
