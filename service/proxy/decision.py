"""The routing decision: a request, its facts, the pools' predicted costs, the upstream picked.

1. Facts (``choose``): the model asked for, the prompt tokens (a token-id prompt's length, else
   a bytes estimate; where the estimate's plausible range straddles a crossover, the local
   tokenizer's count or else an upstream's /tokenize: engine_advisor.service.proxy.tokens), the
   output tokens and the batch the request would join: ``max(workload.batch_size, 1 + in-flight
   requests of the least-loaded available upstream)``, floored by the batch the operator expects an
   engine to run.
2. Costs (``pool_costs``): the proxy's one call into the cost model, the predicted cost of
   each configured (engine, DCP size) group; it uses ``engine_advisor.model.predict.query.evaluate``
   (the configurations the workload allows and their predictions, one pass), nothing else: not the
   recommender's ranking text, launch command, memory reasons or crossover scan.
3. Decision (``Decider``): the groups ranked by those costs. That still costs far more than
   the rest of a proxied request, so decisions are cached by bucket: context and output tokens
   in eighth-octave buckets (each about 9 % wide, so a decision near a crossover is at most a
   few percent of context off), the batch in quarter-octave buckets. The cost model sees the
   bucket's representative value. The cache key includes the model version and the pools
   generation: a model or pools reload never serves an old decision.
4. Pick (``pick``): the available upstream with the fewest requests in flight of the
   best-ranked group that has one (also for each retry,
   engine_advisor.service.proxy.relay.attempts).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.queries import evaluate
from engine_advisor.model.workload import MAX_BATCH, MAX_CONTEXT, MAX_OUTPUT, Workload
from engine_advisor.service.errors import ApiError
from engine_advisor.service.holder import LoadedModel
from engine_advisor.service.proxy.metrics import ProxyMetrics
from engine_advisor.service.proxy.request import ProxyRequest
from engine_advisor.service.proxy.tokens import (
    MAX_BYTES_PER_TOKEN,
    Tokenizer,
    local_count,
    upstream_count,
)
from engine_advisor.service.proxy.upstreams import Pools, Upstream

Group = tuple[str, int]          # (engine, DCP size)
CONTEXT_STEPS = 8     # buckets per octave
OUTPUT_STEPS = 8
BATCH_STEPS = 4
CACHE_SIZE = 16_384
# larger prompts are tokenized off the event loop (the library releases the GIL): a tokenizer
# takes about 0.18 ms per KB (tests/compat's word-level tokenizer.json, 2 vCPUs), so 2 KiB
# cost the loop 0.4 ms where a thread hop costs ~0.1 ms; at 64 KiB each 33 KB prompt held
# the loop for 6-10 ms and 200 of them a second stalled it for seconds
LOCAL_INLINE_BYTES = 2 << 10


# ----------------------------------------------------------------------------- facts
class Routing(Protocol):
    """What ``choose`` reads and changes of the proxy's state
    (engine_advisor.service.proxy.state.ProxyState, which holds a ``Decider``)."""

    tokenizer: Tokenizer | None
    decider: Decider
    metrics: ProxyMetrics
    seq: int                      # pick counter: ties of in-flight go round-robin
    counting: int                 # prompts being counted now (tokens.max_concurrent)


@dataclass(slots=True)
class Choice:
    decision: Decision
    first: Upstream
    prompt_tokens: int
    method: str
    output_tokens: int
    batch_size: int


def _why_unavailable(u: Upstream, now: float) -> str:
    if not u.healthy:
        return f"down ({u.last_error or 'failed health checks'})"
    if now < u.not_before:
        return f"asked to wait (Retry-After) {u.not_before - now:.1f} s more"
    return f"circuit breaker {u.breaker.state}"


def _unavailable(cands: list[Upstream]) -> ApiError:
    now = time.monotonic()
    return ApiError(503, "no upstream is available: " + "; ".join(
        f"{u.name}: {_why_unavailable(u, now)}" for u in cands))


class Counting:
    """A choice that waits for a prompt count (``choose_now``'s answer where the decision
    depends on the count): ``await count()`` gives the ``Choice``."""

    __slots__ = ("st", "pools", "loaded", "req", "cands", "now", "decision", "n", "out",
                 "batch")

    def __init__(self, st: Routing, pools: Pools, loaded: LoadedModel, req: ProxyRequest,
                 cands: list[Upstream], now: float, decision: Decision, n: int, out: int,
                 batch: int):
        self.st, self.pools, self.loaded, self.req = st, pools, loaded, req
        self.cands, self.now, self.decision = cands, now, decision
        self.n, self.out, self.batch = n, out, batch

    async def count(self) -> Choice:
        st, req, cfg = self.st, self.req, self.pools.config
        n, method, decision = self.n, "estimate", self.decision
        st.counting += 1
        try:
            if st.tokenizer is not None:
                if req.prompt_bytes > LOCAL_INLINE_BYTES:
                    n = await asyncio.to_thread(local_count, st.tokenizer, req)
                else:
                    n = local_count(st.tokenizer, req)
                method, decision = "tokenizer", None
            else:
                # the least loaded upstream with a /tokenize; one that turns out to have
                # none (404: trtllm-serve) hands the question to the next
                counted = None
                for asker in sorted((u for u in self.cands if u.available(self.now)
                                     and u.tokenize), key=lambda u: u.in_flight):
                    counted = await upstream_count(asker, req, cfg.tokens.tokenize_timeout_s)
                    if counted is not None or asker.tokenize:
                        break
                if counted is not None:
                    n, method = counted, "upstream"
                    decision = None
        finally:
            st.counting -= 1
        return _chosen(st, self.pools, self.loaded, req, self.cands, decision, n, method,
                       self.out, self.batch)


async def choose(st: Routing, pools: Pools, loaded: LoadedModel, req: ProxyRequest,
                 context_tokens: int | None = None) -> Choice:
    """The request's facts (model, prompt and output tokens, the batch it would join), the
    decision for them, and its first upstream (``pick``)."""
    got = choose_now(st, pools, loaded, req, context_tokens)
    return await got.count() if type(got) is Counting else got


def choose_now(st: Routing, pools: Pools, loaded: LoadedModel, req: ProxyRequest,
               context_tokens: int | None = None) -> Choice | Counting:
    """``choose`` up to the point where it would wait: the choice, or the ``Counting`` to
    await where the decision depends on a prompt count (without one, nothing waits)."""
    cfg = pools.config
    if req.model is None and len(pools.models) > 1:
        raise ApiError(400, f"model: required (served: {', '.join(pools.models)})",
                       param="model")
    cands = pools.serving(req.model)
    if not cands:
        raise ApiError(404, f"model: {req.model!r} is not served by any pool (served: "
                            f"{', '.join(pools.models)})", param="model", type="model_not_found")
    now = time.monotonic()
    least = None                  # the fewest requests in flight of an available upstream
    for u in cands:
        if u.available(now) and (least is None or u.in_flight < least):
            least = u.in_flight
    if least is None:
        raise _unavailable(cands)
    out = req.max_tokens or cfg.workload.output_tokens
    batch = cfg.workload.batch_size
    if least >= batch:                  # max(batch, 1 + least); max() is a slow builtin call
        batch = least + 1
    decision = None
    if context_tokens is not None:
        n, method = context_tokens, "given"
    elif req.prompt_token_ids is not None:
        n, method = req.prompt_token_ids, "token_ids"
    else:
        # the estimate and its plausible range (engine_advisor.service.proxy.tokens); a count
        # (local tokenizer, else the upstream's /tokenize) only where the decision depends on it
        size = req.prompt_bytes
        n, method = round(size / cfg.tokens.bytes_per_token) or 1, "estimate"
        lo, hi = size // MAX_BYTES_PER_TOKEN or 1, size or 1
        decision, differs = st.decider.estimated(
            loaded, pools, n, lo, hi, out, batch,
            st.tokenizer is not None or cfg.tokens.upstream_tokenize)
        if differs:
            if st.counting < cfg.tokens.max_concurrent:
                return Counting(st, pools, loaded, req, cands, now, decision, n, out, batch)
            # bounded: a flood of long prompts does not queue for counts (each a share of a
            # CPU-second, or a round trip); the estimate decides, as without a counter
            st.metrics.counts_skipped.inc(("busy",))
    return _chosen(st, pools, loaded, req, cands, decision, n, method, out, batch)


def _chosen(st: Routing, pools: Pools, loaded: LoadedModel, req: ProxyRequest,
            cands: list[Upstream], decision: Decision | None, n: int, method: str, out: int,
            batch: int) -> Choice:
    counted = st.metrics.counted.get(method)
    if counted is None:
        counted = st.metrics.counted[method] = st.metrics.token_counts.cell((method,))
    counted[0] += 1
    if decision is None:
        decision = st.decider.decide(loaded, pools, n, out, batch)
    st.seq += 1
    first = pick(pools, decision, req.model, [], None, st.seq)
    if first is None:     # every available upstream went away while we counted
        raise _unavailable(cands)
    first.decided[0] += 1                   # st.metrics.decisions, by its group
    return Choice(decision, first, n, method, out, batch)


# ----------------------------------------------------------------------------- costs
@dataclass(frozen=True)
class PoolCost:
    total_s: float               # the workload's batch, prefill and decode
    prefill_s: float
    tpot_s: float
    interval_s: tuple[float, float]
    calibrated: bool
    # calibrated hardware, another model (engine_advisor.model.fit.costmodel.coverage)
    transferred: bool
    extrapolated: bool
    fits_in_memory: bool
    eligible: bool               # calibrated, or extrapolation allowed by the pools file


def pool_costs(model: CostModel, workload: Workload) -> dict[Group, PoolCost]:
    """Each allowed (engine, DCP size) of ``workload.engines`` x ``workload.dcp_sizes``."""
    out = {}
    for e in evaluate(model, workload):
        p = e.pred
        out[(e.config.engine, e.config.dcp_size)] = PoolCost(
            p.total_s, p.prefill_s, p.tpot_s, tuple(p.interval_s), p.calibrated,
            p.transferred, p.extrapolated, p.fits_in_memory, e.eligible)
    return out


def confidence(best: PoolCost, rival: PoolCost | None) -> str:
    """How sure the choice of ``best`` over the best other engine's ``rival`` is: low when
    uncalibrated or the prediction intervals overlap, medium when extrapolated or the batch's
    KV does not fit, else high (the recommender's rule, on the routed pools only)."""
    overlap = (rival is not None and best.interval_s[0] <= rival.interval_s[1]
               and rival.interval_s[0] <= best.interval_s[1])
    if not (best.calibrated or best.transferred) or overlap:
        return "low"
    if best.extrapolated or not best.fits_in_memory:
        return "medium"
    return "high"


# ----------------------------------------------------------------------------- decision
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
        exact = self._exact
        got = exact.get(key)            # _Lru.hit, inline: this runs for every request
        if got is not None:
            exact.move_to_end(key)
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


# ----------------------------------------------------------------------------- pick
def pick(pools: Pools, decision: Decision, model: str | None, tried: list[Upstream],
         engine: str | None, seq: int | None) -> Upstream | None:
    """The available upstream with the fewest requests in flight, of the best-ranked group
    that has one; with ``engine`` set, that engine's groups first (then no others). ``seq``:
    the pick's turn in the round robin of ties, or None for a look that takes no turn."""
    now = time.monotonic()
    groups = decision.ranked
    if engine is not None:
        groups = tuple(g for g in groups if g[0] == engine)
    for g in groups:
        best: Upstream | None = None
        for u in pools.groups.get(g, ()):
            if u in tried or (model is not None and u.spec.model != model) \
                    or not u.available(now):
                continue
            if best is None or u.in_flight < best.in_flight or (
                    u.in_flight == best.in_flight and u.picked < best.picked):
                best = u
        if best is not None:
            if seq is not None:
                best.picked = seq
            return best
    return None
