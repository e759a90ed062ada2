"""Which configured (engine, DCP size) group serves a request best, from the cost model.

``model.recommend.recommend`` costs a few hundred microseconds, too much per request, so its
answers are cached by bucket: context and output tokens in eighth-octave buckets (each about
9 % wide, so a decision near a crossover is at most a few percent of context off), the batch
in quarter-octave buckets. The recommender sees the bucket's representative value. The cache
key includes the model version and the pools generation: a model or pools reload never serves
an old decision.

The batch is ``max(workload.batch_size, 1 + in-flight requests of the least-loaded available
upstream)``: the concurrency the request would join, floored by the batch the operator
expects an engine to run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from model.recommend import NoEligibleConfiguration, recommend
from model.schemas import ConfigPrediction
from model.workload import MAX_BATCH, MAX_CONTEXT, MAX_OUTPUT
from service.holder import LoadedModel
from service.upstreams import Pools

CONTEXT_STEPS = 8     # buckets per octave
OUTPUT_STEPS = 8
BATCH_STEPS = 4
CACHE_SIZE = 16_384


def bucket(x: int, steps: int) -> int:
    return round(math.log2(max(x, 1)) * steps)


def representative(k: int, steps: int, cap: int) -> int:
    return min(cap, max(1, round(2.0 ** (k / steps))))


@dataclass(frozen=True)
class Decision:
    ranked: tuple[tuple[str, int], ...]          # configured groups, best first
    predictions: dict[tuple[str, int], ConfigPrediction] = field(hash=False)
    confidence: str
    context_tokens: int
    output_tokens: int
    batch_size: int
    model_version: str
    note: str | None = None

    @property
    def best(self) -> tuple[str, int]:
        return self.ranked[0]


class Decider:
    def __init__(self, size: int = CACHE_SIZE):
        self.size = size
        self._cache: dict[tuple, Decision] = {}
        self._agree: dict[tuple, Decision | None] = {}
        self.hits = self.misses = 0

    def decide(self, loaded: LoadedModel, pools: Pools, context: int, output: int,
               batch: int) -> Decision:
        bc, bo, bb = (bucket(context, CONTEXT_STEPS), bucket(output, OUTPUT_STEPS),
                      bucket(batch, BATCH_STEPS))
        key = (loaded.version, pools.generation, bc, bo, bb)
        d = self._cache.get(key)
        if d is not None:
            self.hits += 1
            return d
        self.misses += 1
        d = self._compute(loaded, pools, representative(bc, CONTEXT_STEPS, MAX_CONTEXT),
                          representative(bo, OUTPUT_STEPS, MAX_OUTPUT),
                          representative(bb, BATCH_STEPS, MAX_BATCH))
        if len(self._cache) >= self.size:
            self._cache.clear()
        self._cache[key] = d
        return d

    def agree(self, loaded: LoadedModel, pools: Pools, lo: int, hi: int, output: int,
              batch: int, points: int = 5) -> Decision | None:
        """The decision when it is the same for every context in [lo, hi] (checked at
        ``points`` log-spaced contexts), else None. Remembered by buckets too."""
        key = (loaded.version, pools.generation, bucket(lo, CONTEXT_STEPS),
               bucket(hi, CONTEXT_STEPS), bucket(output, OUTPUT_STEPS), bucket(batch, BATCH_STEPS))
        if key in self._agree:
            return self._agree[key]
        first = self.decide(loaded, pools, lo, output, batch)
        if hi > lo:
            for i in range(1, points):
                ctx = round(lo * (hi / lo) ** (i / (points - 1)))
                if self.decide(loaded, pools, ctx, output, batch).best != first.best:
                    first = None
                    break
        if len(self._agree) >= self.size:
            self._agree.clear()
        self._agree[key] = first
        return first

    @staticmethod
    def _compute(loaded: LoadedModel, pools: Pools, context: int, output: int,
                 batch: int) -> Decision:
        groups = list(pools.groups)
        w = pools.config.workload.workload(context, output, batch, pools.engines,
                                           pools.dcp_sizes)
        try:
            rec = recommend(loaded.model, w, loaded.version)
        except NoEligibleConfiguration as exc:
            return Decision(tuple(groups), {}, "none", context, output, batch, loaded.version,
                            note=f"the cost model ranks no configured pool ({exc}); "
                                 "routing in configuration order")
        preds = {(p.engine, p.dcp_size): p for p in rec.predictions}
        allow = w.allow_extrapolation

        def rank(g: tuple[str, int]) -> tuple[int, float]:
            p = preds.get(g)
            if p is None:
                return (2, 0.0)
            return (0 if (p.calibrated or allow) else 1, p.total_s)

        ranked = tuple(sorted(groups, key=rank))
        best = ranked[0]
        conf = rec.confidence if best == (rec.engine, rec.dcp_size) else "low"
        note = None if best in preds else "the cost model cannot predict the configured pools"
        return Decision(ranked, {g: preds[g] for g in ranked if g in preds}, conf, context,
                        output, batch, loaded.version, note)
