"""Which configured (engine, DCP size) group serves a request best, from the cost model.

The configured groups are ranked by ``costs.pool_costs`` (predictions only). That still costs
far more than the rest of a proxied request, so decisions are cached by bucket: context and
output tokens in eighth-octave buckets (each about 9 % wide, so a decision near a crossover is
at most a few percent of context off), the batch in quarter-octave buckets. The cost model sees
the bucket's representative value. The cache key includes the model version and the pools
generation: a model or pools reload never serves an old decision.

The batch is ``max(workload.batch_size, 1 + in-flight requests of the least-loaded available
upstream)``: the concurrency the request would join, floored by the batch the operator
expects an engine to run.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from model.workload import MAX_BATCH, MAX_CONTEXT, MAX_OUTPUT
from service.holder import LoadedModel
from service.proxy.costs import Group, PoolCost, confidence, pool_costs
from service.proxy.upstreams import Pools

CONTEXT_STEPS = 8     # buckets per octave
OUTPUT_STEPS = 8
BATCH_STEPS = 4
CACHE_SIZE = 16_384


def bucket(x: int, steps: int) -> int:
    return round(math.log2(x if x > 1 else 1) * steps)


def representative(k: int, steps: int, cap: int) -> int:
    return min(cap, max(1, round(2.0 ** (k / steps))))


@dataclass(frozen=True)
class Decision:
    ranked: tuple[Group, ...]                    # configured groups, best first
    predictions: dict[Group, PoolCost] = field(hash=False)
    confidence: str
    context_tokens: int
    output_tokens: int
    batch_size: int
    model_version: str
    note: str | None = None

    @property
    def best(self) -> Group:
        return self.ranked[0]


class _Lru(OrderedDict):
    """At most ``size`` entries, the least recently read one dropped first (an OrderedDict:
    a hit costs a dict lookup and a C-level move, not Python-level cache bookkeeping)."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def hit(self, key, missing=None):
        value = self.get(key, missing)
        if value is not missing:
            self.move_to_end(key)
        return value

    def put(self, key, value) -> None:
        self[key] = value
        if len(self) > self.size:
            self.popitem(last=False)


_MISSING = object()


class Decider:
    def __init__(self, size: int = CACHE_SIZE):
        self.size = size
        self._cache = _Lru(size)
        self._agree = _Lru(size)
        self._exact = _Lru(size)      # estimated(): its exact arguments to its answer
        self.hits = self.misses = 0

    def decide(self, loaded: LoadedModel, pools: Pools, context: int, output: int,
               batch: int) -> Decision:
        return self._decide(loaded, pools, bucket(context, CONTEXT_STEPS),
                            bucket(output, OUTPUT_STEPS), bucket(batch, BATCH_STEPS))

    def _decide(self, loaded: LoadedModel, pools: Pools, bc: int, bo: int, bb: int) -> Decision:
        key = (loaded.version, pools.generation, bc, bo, bb)
        d = self._cache.hit(key)
        if d is not None:
            self.hits += 1
            return d
        self.misses += 1
        d = self._compute(loaded, pools, representative(bc, CONTEXT_STEPS, MAX_CONTEXT),
                          representative(bo, OUTPUT_STEPS, MAX_OUTPUT),
                          representative(bb, BATCH_STEPS, MAX_BATCH))
        self._cache.put(key, d)
        return d

    def agree(self, loaded: LoadedModel, pools: Pools, lo: int, hi: int, output: int,
              batch: int, points: int = 5) -> Decision | None:
        """The decision when it is the same for every context in [lo, hi] (checked at
        ``points`` log-spaced contexts), else None. Remembered by buckets too."""
        return self._agree_b(loaded, pools, lo, hi, bucket(output, OUTPUT_STEPS),
                             bucket(batch, BATCH_STEPS), points)

    def _agree_b(self, loaded: LoadedModel, pools: Pools, lo: int, hi: int, bo: int, bb: int,
                 points: int = 5) -> Decision | None:
        bl = bucket(lo, CONTEXT_STEPS)
        key = (loaded.version, pools.generation, bl, bucket(hi, CONTEXT_STEPS), bo, bb)
        first = self._agree.hit(key, _MISSING)
        if first is not _MISSING:
            return first
        first = self._decide(loaded, pools, bl, bo, bb)
        if hi > lo:
            for i in range(1, points):
                ctx = round(lo * (hi / lo) ** (i / (points - 1)))
                if self._decide(loaded, pools, bucket(ctx, CONTEXT_STEPS), bo,
                                bb).best != first.best:
                    first = None
                    break
        self._agree.put(key, first)
        return first

    def estimated(self, loaded: LoadedModel, pools: Pools, context: int, lo: int, hi: int,
                  output: int, batch: int, check: bool) -> tuple[Decision, bool]:
        """For an estimated ``context`` (plausibly ``lo``..``hi``): its decision, and (with
        ``check``) whether another context in the range would be decided otherwise (then the
        count is worth asking for). One bucketing of the output and batch for both; the
        answer is remembered for these exact arguments (repeated requests of one size skip
        the bucketing too)."""
        key = (loaded.version, pools.generation, context, lo, hi, output, batch, check)
        got = self._exact.hit(key)
        if got is not None:
            self.hits += 1
            return got
        bo, bb = bucket(output, OUTPUT_STEPS), bucket(batch, BATCH_STEPS)
        differs = check and self._agree_b(loaded, pools, lo, hi, bo, bb) is None
        got = self._decide(loaded, pools, bucket(context, CONTEXT_STEPS), bo, bb), differs
        self._exact.put(key, got)
        return got

    @staticmethod
    def _compute(loaded: LoadedModel, pools: Pools, context: int, output: int,
                 batch: int) -> Decision:
        groups = list(pools.groups)
        w = pools.config.workload.workload(context, output, batch, pools.engines,
                                           pools.dcp_sizes)
        costs = {g: c for g, c in pool_costs(loaded.model, w).items() if g in pools.groups}
        if not any(c.eligible for c in costs.values()):
            return Decision(tuple(groups), costs, "none", context, output, batch,
                            loaded.version, note="the cost model ranks no configured pool (none "
                            "holds one sequence of this request, or calibrated pools exist "
                            "and allow_extrapolation is off); routing in configuration order")

        def rank(g: Group) -> tuple[int, float]:
            c = costs.get(g)
            return (2, 0.0) if c is None else (0 if c.eligible else 1, c.total_s)

        ranked = tuple(sorted(groups, key=rank))
        best = ranked[0]
        rival = next((costs[g] for g in ranked[1:] if g in costs and costs[g].eligible
                      and g[0] != best[0]), None)
        note = None if best in costs else "the cost model cannot predict the configured pools"
        return Decision(ranked, {g: costs[g] for g in ranked if g in costs},
                        confidence(costs[best], rival) if best in costs else "low",
                        context, output, batch, loaded.version, note)
