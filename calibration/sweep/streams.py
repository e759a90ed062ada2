"""What one point's token streams say, in the cost model's own quantities.

All requests of a point are sent at once. Each streamed chunk carries one token, so a request's
chunk times are its send time, its TTFT, then its inter-token gaps. From those of the whole
batch:

- ``prefill_s``: the first request sent -> the last first token: the batch's prefill (the cost
  model's first-wave prefill: the fitted quantity ``ttft``). At batch 1 it is the request's TTFT.
- ``decode_step_s``: one decode step of the whole batch with no prefill in it (the fitted ``step``):
  the median gap between consecutive tokens of any request, over the window in which every
  request of the batch has its first token and none has finished. Before that window an engine
  that chunks prefill into decode steps (vLLM) runs steps that carry other requests' prefill;
  after it the batch shrinks. ``decode_steps`` counts the gaps the median is taken over.
- ``decode_context``: the mean context of a sequence over that window (prompt + tokens so far).

The engines' own TPOT (``vllm bench serve``'s ``(e2e - ttft) / (output - 1)``, averaged over
requests) mixes all three phases and is kept as ``tpot_s`` for comparison only.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MIN_WINDOW_GAPS = 3      # fewer gaps in the window than this: no decode step is recorded


@dataclass(frozen=True)
class StreamTimes:
    prefill_s: float | None
    decode_step_s: float | None
    decode_steps: int
    decode_context: float | None


@dataclass(frozen=True)
class Stream:
    """One request's chunk times, seconds from the batch start."""

    start_s: float
    token_s: tuple[float, ...]     # first token, then one per chunk

    @classmethod
    def of(cls, start_s: float, ttft_s: float, itl_s: Sequence[float]) -> Stream:
        t = start_s + ttft_s
        times = [t]
        for gap in itl_s:
            t += gap
            times.append(t)
        return cls(start_s, tuple(times))


def stream_times(streams: Sequence[Stream], prompt_tokens: int) -> StreamTimes:
    """The point's quantities (module docstring) from its requests' streams."""
    streams = [s for s in streams if s.token_s]
    if not streams:
        return StreamTimes(None, None, 0, None)
    t0 = min(s.start_s for s in streams)
    all_first = max(s.token_s[0] for s in streams)
    first_end = min(s.token_s[-1] for s in streams)
    gaps: list[float] = []
    ctx: list[float] = []
    for s in streams:
        for i in range(1, len(s.token_s)):
            a, b = s.token_s[i - 1], s.token_s[i]
            if a >= all_first and b <= first_end:
                gaps.append(b - a)
                ctx.append(prompt_tokens + i)
    if len(gaps) < MIN_WINDOW_GAPS:
        return StreamTimes(all_first - t0, None, len(gaps), None)
    return StreamTimes(all_first - t0, statistics.median(gaps), len(gaps),
                       sum(ctx) / len(ctx))
