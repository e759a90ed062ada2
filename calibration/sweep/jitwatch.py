"""Which point a JIT compile hit: log lines matched to the points' wall-clock intervals.

A JIT line's time (second resolution, the engine's local time) is matched to the interval of a
point (or the warm-up), widened by ``SLACK_S`` on both sides. Of several candidates, the one
during which the line appeared in the log (``fallback``: the sweep reads the log after each
point), else the one that overlaps the line's second ``[t, t + 1 s)`` most (then the one that
started last). A line whose time matches no interval (or cannot be read) is given to
``fallback``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from engine_advisor.calibration.sweep.engine_jit import JitEvent

SLACK_S = 1.0


@dataclass(frozen=True)
class Interval:
    label: str                 # a point key's text, "warmup", or a run's start time
    start: dt.datetime         # aware
    end: dt.datetime


@dataclass(frozen=True)
class JitHit:
    kernel: str
    log_time: str
    during: str | None         # the interval's label
    matched_by: str            # "time and log position" | "time" | "log position" | "none"

    def to_json(self) -> dict[str, str | None]:
        return {"kernel": self.kernel, "log_time": self.log_time, "during": self.during,
                "matched_by": self.matched_by}


def attribute(events: Sequence[JitEvent], intervals: Sequence[Interval],
              fallback: str | None = None, tz: dt.tzinfo | None = None) -> list[JitHit]:
    """Each event with the interval it hit. ``tz``: the log's time zone (default: this
    machine's local zone)."""
    out = []
    slack = dt.timedelta(seconds=SLACK_S)
    for ev in events:
        near = (intervals[-1].end if intervals else dt.datetime.now(dt.UTC))
        near = near.astimezone(tz) if tz is not None else near.astimezone()
        t = ev.time(near)
        hits = [iv for iv in intervals if t is not None and iv.start - slack <= t <= iv.end + slack]
        if fallback is not None and any(iv.label == fallback for iv in hits):
            out.append(JitHit(ev.kernel, ev.log_time, fallback, "time and log position"))
        elif hits:
            best = max(hits, key=lambda iv, t=t: (_overlap(iv, t), iv.start))
            out.append(JitHit(ev.kernel, ev.log_time, best.label, "time"))
        elif fallback is not None:
            out.append(JitHit(ev.kernel, ev.log_time, fallback, "log position"))
        else:
            out.append(JitHit(ev.kernel, ev.log_time, None, "none"))
    return out


def _overlap(iv: Interval, t: dt.datetime) -> float:
    second = dt.timedelta(seconds=1)
    return max(0.0, (min(iv.end, t + second) - max(iv.start, t)).total_seconds())


def parse_utc(text: str) -> dt.datetime | None:
    """An ISO time as the run store writes it (``utc_now``)."""
    try:
        t = dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)
