"""The engine core: one scheduler task doing continuous batching with cost-model step times.

Each loop iteration either prefills the requests it can admit or runs one decode step of every
running sequence. Admission is the engine's memory as the recommender models it
(``engine_advisor.model.physics.capacity.Pool``): a request of prompt + planned output ``n`` tokens
reserves ``pool.units_for(n)`` of the pool's ``units`` (KV tokens; for a hybrid on vLLM, pages of KV
and state; on SGLang, KV tokens beside its state slots), at most ``pool.max_running`` run, FCFS, so
the head of the queue blocks the rest like the engines' default scheduler. A prefill of k new
requests takes the cost model's TTFT at batch k and their mean prompt length and yields each
request's first token; a decode step takes the cost model's TPOT at batch = number running and
context = their mean, and yields one token each.

An idle engine that receives a request collects arrivals for ``admit_window_s`` (wall seconds,
default 0; ``sim --admit-window-ms``) before its first step, so that requests a client sends at
once are prefilled together rather than split by the order the HTTP layer hands them over (it
parses and tokenizes one request at a time: several milliseconds each for long text prompts).
That burst is timed from its first request's arrival, the moment the HTTP layer received it, as
if all had arrived with it: neither that intake nor the window adds time as long as the window
is shorter than the scaled prefill (a longer one delays the first tokens to its end).

Times run on an absolute clock (``_clock``): a step that starts late does not push later
steps back, and when the process falls behind (time scale 0.001 asks for thousands of steps a
second) one iteration runs k steps at once, bounded so that no sequence finishes mid-way.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable

from engine_advisor.model.engines.base import NO_STATE, StateLayout
from engine_advisor.model.physics.capacity import Pool
from engine_advisor.sim.metrics import Stats
from engine_advisor.sim.timing import StepTimer

WAITING, PREFILL, RUNNING, DONE = range(4)
MAX_STEPS_PER_ITERATION = 256


def token_pool(capacity_tokens: int, max_running: int) -> Pool:
    """A pool of plain KV tokens: a request of ``n`` tokens takes ``n`` of
    ``capacity_tokens``, at most ``max_running`` run (a model without state)."""
    return Pool(float(capacity_tokens), 1.0, 1.0, 0.0, max_running, capacity_tokens, 0,
                StateLayout(NO_STATE, state_bytes=0.0, unit_bytes=0.0))


class SimRequest:
    """One request inside the engine; the HTTP layer waits on ``event`` for progress."""

    __slots__ = ("rid", "prompt_len", "n_out", "cached", "units", "arrival", "ready_at",
                 "state", "produced", "first_token_at", "last_token_at", "finished_at",
                 "aborted", "event", "reason")

    def __init__(self, rid: str, prompt_len: int, n_out: int, arrival: float, units: float,
                 cached: int = 0, reason: str = "length"):
        self.rid = rid
        self.reason = reason
        self.prompt_len = prompt_len
        self.n_out = n_out
        self.cached = cached
        self.units = units            # of the pool, for prompt + planned output
        self.arrival = arrival
        self.ready_at = arrival       # the earliest the engine may start it (a burst: its first)
        self.state = WAITING
        self.produced = 0
        self.first_token_at = 0.0
        self.last_token_at = 0.0
        self.finished_at = 0.0
        self.aborted = False
        self.event = asyncio.Event()

    @property
    def finished(self) -> bool:
        return self.state == DONE


class EngineCore:
    def __init__(self, timer: StepTimer, pool: Pool, *, time_scale: float,
                 stats: Stats | None = None, admit_window_s: float = 0.0,
                 slots_per_request: int = 0):
        self.timer = timer
        self.admit_window = admit_window_s
        self.pool = pool
        # SGLang's state slots a running request holds (its metrics report them; the pool's
        # running limit already accounts for them)
        self.slots_per_request = slots_per_request
        self.units = pool.units
        self.max_running = pool.max_running
        self._units_for: Callable[[float], float] = pool.units_for
        self.scale = time_scale
        self.stats = stats or Stats()
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.reserved = 0.0          # units held by the running and prefilling requests
        self._ctx_sum = 0            # sum of current contexts (prompt + produced) of running
        self._wake = asyncio.Event()
        self._clock = 0.0
        self._window_end = 0.0       # wall time the last admit window closed
        self._ids = itertools.count()
        self._task: asyncio.Task | None = None
        # called after every iteration with (kind "prefill" | "decode", steps, wall seconds of
        # one step, requests in it, requests it finished, prompt tokens it prefilled): an engine
        # that reports per-iteration statistics (TensorRT-LLM's JSON /metrics) records them
        self.on_step: Callable[[str, int, float, int, int, int], None] | None = None

    # ------------------------------------------------------------------ public
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="sim-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    @property
    def num_running(self) -> int:
        return len(self.running) + len(self.prefilling)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_used_tokens(self) -> int:
        return self._ctx_sum + sum(r.prompt_len for r in self.prefilling)

    def kv_usage(self) -> float:
        """The pool's units reserved, 0 .. 1."""
        return min(max(self.reserved / self.units, 0.0), 1.0) if self.units > 0 else 0.0

    def fits(self, prompt_len: int, n_out: int) -> bool:
        """Whether a request could ever be admitted (alone in the pool)."""
        return self.pool.holds(prompt_len + n_out)

    def submit(self, prompt_len: int, n_out: int, *, reason: str = "length",
               cached: int = 0, received: float | None = None) -> SimRequest:
        """Queue a request of ``prompt_len`` tokens that will generate ``n_out`` tokens and
        then finish with ``reason``. ``received``: when the HTTP layer got it (loop time; its
        parsing and tokenization since then are the simulator's overhead), else now."""
        now = asyncio.get_running_loop().time()
        arrival = now if received is None else min(received, now)
        req = SimRequest(f"{next(self._ids)}", prompt_len, n_out, arrival,
                         self._units_for(prompt_len + n_out), cached, reason)
        self.waiting.append(req)
        self._wake.set()
        return req

    def abort(self, req: SimRequest) -> None:
        """Drop a request at once (client gone): it leaves the queue or the running batch."""
        if req.state == DONE:
            return
        if req.state == WAITING:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        elif req.state == PREFILL:
            self.prefilling.remove(req)
            self._release(req)
        elif req.state == RUNNING:
            self.running.remove(req)
            self._release(req)
            self._ctx_sum -= req.prompt_len + req.produced
        req.aborted = True
        req.state = DONE
        req.finished_at = asyncio.get_running_loop().time()
        self.stats.finished["abort"] += 1
        req.event.set()
        self._wake.set()

    # --------------------------------------------------------------- scheduler
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        idle = True
        while True:
            if not self.running and not self.waiting:
                idle = True
                self._wake.clear()
                await self._wake.wait()
            if idle:            # the first request(s) after a pause
                idle = False
                if self.admit_window > 0 and self.waiting:
                    await self._collect_burst(loop)
                    if not self.waiting:        # all aborted in the window: idle again
                        continue
                else:
                    self._clock = loop.time()
            if self._admit():
                await self._prefill(loop)
            elif self.running:
                await self._decode(loop)
            else:
                # Queue blocked by capacity with nothing running cannot happen (requests that
                # cannot fit are refused at submission); wait for an abort or a new request.
                self._wake.clear()
                await self._wake.wait()

    async def _collect_burst(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait out the admit window; whatever arrived in it counts as sent with the first
        arrival (the prefill is timed from there, the window overlapping it)."""
        await asyncio.sleep(max(self.waiting[0].arrival + self.admit_window - loop.time(), 0.0))
        self._window_end = loop.time()
        if not self.waiting:        # all aborted meanwhile
            return
        # the earliest receipt (tokenization may reorder them), not before the last step's end
        first = max(min(r.arrival for r in self.waiting), self._clock)
        for r in self.waiting:
            r.ready_at = first
        self._clock = first

    def _admit(self) -> bool:
        while self.waiting and self.num_running < self.max_running:
            req = self.waiting[0]
            if self.reserved + req.units > self.units + 1e-6:
                break
            self.waiting.popleft()
            self.reserved += req.units
            req.state = PREFILL
            self.prefilling.append(req)
        return bool(self.prefilling)

    def _release(self, req: SimRequest) -> None:
        """Give back the units of a request that has left the running or prefilling set."""
        self.reserved -= req.units
        self._settle()

    def _settle(self) -> None:
        if not self.running and not self.prefilling:
            self.reserved = 0.0      # no rounding residue of fractional units left behind

    async def _prefill(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self.prefilling
        prompt = sum(r.prompt_len for r in batch)
        ctx = prompt / len(batch)
        dur = self.timer.prefill_s(len(batch), ctx)
        cached = sum(r.cached for r in batch)
        if cached:   # a prefix-cache hit skips the cached share of the prefill work
            hit_ctx = cached / len(batch)
            dur -= self.timer.prefill_s(len(batch), hit_ctx) - self.timer.prefill_s(len(batch), 1)
        start = max(self._clock, max(r.ready_at for r in batch))
        # a window longer than the prefill: the first tokens come when it closes
        self._clock = max(start + max(dur, 0.0) * self.scale, self._window_end)
        delay = self._clock - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        # the event's time: the simulated clock, unless the loop is already past it (late). An
        # event loop's time can be coarse (uvloop's: whole milliseconds, cached per iteration),
        # which would stamp sub-millisecond requests with a latency of 0.
        now = max(loop.time(), self._clock)
        stats = self.stats
        stats.prompt_tokens += prompt
        stats.cached_prompt_tokens += cached
        self.prefilling = []
        for r in batch:
            if r.state != PREFILL:      # aborted while prefilling
                continue
            r.produced = 1
            r.first_token_at = r.last_token_at = now
            stats.ttft.observe(now - r.arrival)
            stats.queue.observe(max(start - r.arrival, 0.0))
            stats.generation_tokens += 1
            if r.n_out <= 1:
                self._finish(r, now)
                self.reserved -= r.units
            else:
                r.state = RUNNING
                self.running.append(r)
                self._ctx_sum += r.prompt_len + 1
            r.event.set()
        self._settle()
        stats.sample_throughput(now)
        if self.on_step is not None:
            done = sum(1 for r in batch if r.state == DONE and not r.aborted)
            self.on_step("prefill", 1, max(dur, 0.0) * self.scale, len(batch), done,
                         prompt - cached)

    async def _decode(self, loop: asyncio.AbstractEventLoop) -> None:
        running = self.running
        b = len(running)
        step = self.timer.step_s(b, self._ctx_sum / b) * self.scale
        now = loop.time()
        target = self._clock + step
        if target > now:
            n = 1
            await asyncio.sleep(target - now)
        else:
            remaining = min(r.n_out - r.produced for r in running)
            n = max(1, min(int((now - self._clock) / step) if step > 0 else remaining,
                           remaining, MAX_STEPS_PER_ITERATION))
        self._clock += n * step
        now = max(loop.time(), self._clock)     # as in _prefill
        b = len(running)                # some may have been aborted while we slept
        if not b:
            return
        stats = self.stats
        done = False
        itl_observe = stats.itl.observe
        for r in running:
            gap = (now - r.last_token_at) / n
            itl_observe(gap, n)
            r.produced += n
            r.last_token_at = now
            if r.produced >= r.n_out:
                done = True
            r.event.set()
        stats.generation_tokens += n * b
        self._ctx_sum += n * b
        finished = 0
        if done:
            keep = []
            for r in running:
                if r.produced >= r.n_out:
                    self._finish(r, now)
                    finished += 1
                    self.reserved -= r.units
                    self._ctx_sum -= r.prompt_len + r.produced
                else:
                    keep.append(r)
            self.running = keep
            self._settle()
        stats.sample_throughput(now)
        if self.on_step is not None:
            self.on_step("decode", n, step, b, finished, 0)
        if n > 1:
            await asyncio.sleep(0)      # let the streams write before the next burst

    def _finish(self, r: SimRequest, now: float) -> None:
        r.state = DONE
        r.finished_at = now
        s = self.stats
        s.e2e.observe(now - r.arrival)
        if r.produced > 1:
            s.tpot.observe((now - r.first_token_at) / (r.produced - 1))
        s.finished[r.reason] = s.finished.get(r.reason, 0) + 1
        r.event.set()
