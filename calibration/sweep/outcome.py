"""What became of each point of a sweep (``Outcome``: ok, partial, oom, failed-start or failed,
with its row if one was written), and the table ``calibrate run`` prints of them at the end."""

from __future__ import annotations

from dataclasses import dataclass

from engine_advisor.calibration.sweep.runstore import PointKey
from engine_advisor.model.fit.dataset import Measurement


@dataclass
class Outcome:
    key: PointKey
    status: str                     # ok | partial | oom | failed-start | failed
    row: Measurement | None
    message: str = ""


def summary_table(outcomes: list[Outcome]) -> str:
    head = (f"{'dcp':>4}{'mem':>6}{'context':>9}{'batch':>6}{'out':>6}{'rep':>4}"
            f"{'TTFT s':>9}{'step ms':>9}{'TPOT ms':>9}{'total s':>9}{'err':>5}{'oom':>5}"
            "  status")
    lines = [head, "-" * len(head)]
    for o in outcomes:
        k, r = o.key, o.row

        def fmt(v: float | None, scale: float = 1.0, w: int = 9, p: int = 3) -> str:
            return f"{v * scale:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"

        lines.append(
            f"{k.dcp_size:>4}{k.mem_fraction:>6.2f}{k.context_tokens:>9}{k.batch_size:>6}"
            f"{k.output_tokens:>6}{k.repeat:>4}"
            + (fmt(r.ttft_s) + fmt(r.decode_step_s, 1e3, p=2) + fmt(r.tpot_s, 1e3, p=2)
               + fmt(r.total_s) + f"{r.errors:>5}{r.oom_retries:>5}"
               if r else f"{'-':>9}" * 4 + f"{'-':>5}" * 2)
            + f"  {o.status}" + (f": {o.message}" if o.message and o.status != "ok" else ""))
    return "\n".join(lines)
