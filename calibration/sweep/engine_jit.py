"""The JIT compiles an engine reports while serving: vLLM logs "Triton kernel JIT compilation
during inference: <kernel>" with the log line's time (``MM-DD HH:MM:SS``, the engine's local
time, no year); ``jit_events`` finds them, ``log_time`` reads their time and ``LogTail`` reads a
growing log from where it last stopped. Which point each hit:
``engine_advisor.calibration.sweep.jitwatch``.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JitEvent:
    kernel: str
    log_time: str            # as the log prints it: "12-01 09:44:21" or "2026-12-01 09:44:21"
    line: str = ""

    def time(self, near: dt.datetime) -> dt.datetime | None:
        """The event's time as an aware datetime, reading the log's local time in ``near``'s
        time zone, the year (when the log omits it) the one that puts it closest to ``near``."""
        return log_time(self.log_time, near)

    def to_json(self) -> dict[str, str]:
        return {"kernel": self.kernel, "log_time": self.log_time}


_JIT = re.compile(r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\d\d-\d\d \d\d:\d\d:\d\d)"
                  r".*?JIT compilation during inference: (?P<kernel>[\w.\-]+?)\.?(?:\s|$)")


def jit_events(text: str) -> list[JitEvent]:
    return [JitEvent(m["kernel"], m["ts"], m[0][:300]) for m in _JIT.finditer(text)]


def log_time(text: str, near: dt.datetime) -> dt.datetime | None:
    """A log timestamp (``YYYY-MM-DD HH:MM:SS`` or ``MM-DD HH:MM:SS``) in ``near``'s time
    zone; without a year, the one closest to ``near``."""
    tz = near.tzinfo
    try:
        if len(text) == 19:
            return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=tz)
        best = None
        for year in (near.year - 1, near.year, near.year + 1):
            try:
                t = dt.datetime.strptime(f"{year}-{text}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=tz)
            except ValueError:          # 02-29 in a year without it
                continue
            if best is None or abs(t - near) < abs(best - near):
                best = t
        return best
    except ValueError:
        return None


class LogTail:
    """Reads what a growing log gained since the last ``read`` (a torn last line waits)."""

    def __init__(self, path: str | Path, offset: int = 0):
        self.path = Path(path)
        self.offset = offset

    def read(self) -> str:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return ""
        cut = data.rfind(b"\n") + 1
        self.offset += cut
        return data[:cut].decode("utf-8", errors="replace")
