"""One instance's memory, as its engine lays it out: the KV budget, the pool and running limit
(``pool_of``), and the sequences of a batch that run at once, what binds them and the knob that
lets more run (``memory_fit``); ``engine_advisor.model.physics.memory`` documents it."""

from __future__ import annotations

import numpy as np
from numba import njit

from engine_advisor.model.formulas.layout import (
    ACT_PEAK,
    ACT_SEQ,
    KV_GPU_TOKEN,
    MAX_LEN,
    MEMORY,
    R_ADVISE,
    R_ATTN_UNITS,
    R_BLOCK,
    R_DEFAULT_RUNNING,
    R_MAX_RUNNING,
    R_MODE,
    R_NO_PREFIX,
    R_RATIO,
    R_REPORT_UNITS,
    R_SLOTS,
    R_STATE,
    R_STATE_UNITS,
    R_UNIT,
    TP,
    WEIGHT_BYTES,
    WINDOW_GPU,
)

# engine_advisor.model.engines.base: NO_STATE, PAGED, SPLIT (a StateLayout's mode)
PAGED, SPLIT = 1.0, 2.0
# SGLang's default running-request limit: int(KV tokens / context length x 512), within these
ESTIMATE_LO, ESTIMATE_HI = 2048.0, 4096.0
PROFILED_MAX = 8192.0        # vLLM profiles at most max_num_batched_tokens sequences
# What binds the sequences running at once (a prediction's ``running_limit``)
(LIMIT_NONE, LIMIT_KV, LIMIT_STATE, LIMIT_RUNNING) = (0.0, 1.0, 2.0, 3.0)
# The memory knobs a recommendation proposes (engine_advisor.model.engines.base.knobs_of reads the
# code)
(KNOB_NONE, KNOB_RUNNING, KNOB_SLOTS, KNOB_NO_PREFIX) = (0.0, 1.0, 2.0, 3.0)
# per row: running, capacity, one fits, all fit, what binds, knob, running limit, state slots;
# with the engine's default knobs: running, capacity, what binds
N_FACTS = 11


@njit(cache=True, inline="always")
def kv_budget(K, rows, i, profiled: float) -> float:
    """Bytes per GPU a row's memory fraction leaves for KV and state: fraction x memory, less
    the engine's reserve, the weights' share and, where the engine's budget holds it, the
    activation peak of a profiled pass (``K[ACT_PEAK]``) and its sampler's ``profiled`` rows
    (vLLM profiles ``max_num_seqs`` of them, ``K[ACT_SEQ]`` bytes each)."""
    act = rows[8, i] * (K[ACT_PEAK] + K[ACT_SEQ] * min(profiled, PROFILED_MAX))
    return rows[1, i] * K[MEMORY] - rows[0, i] - K[WEIGHT_BYTES] / K[TP] - act


@njit(cache=True, inline="always")
def _floor_div(x: float, y: float) -> float:
    return np.floor(x / y) if y > 0.0 else float(2 ** 62)


@njit(cache=True)
def pool_of(K, rows, i, d, req, slots_req, no_prefix):
    """The memory one instance of row ``i``'s engine holds at DCP ``d``, launched with a
    running-request limit ``req``, ``slots_req`` state slots and the prefix cache off
    (``no_prefix``; 0 / False: the defaults), as its engine lays it out (``rows``' ``R_MODE``,
    the layout's fields ``engine_advisor.model.engines.base.StateLayout``):

    - no state: KV tokens = budget / (KV bytes per token per GPU / d); what else a sequence
      holds (its sliding windows' KV, a state without an engine layout) in tokens of KV;
    - PAGED (vLLM): pool blocks = budget // (page x layers per group), less the null block; a
      request holds ``attn_units`` x ceil(tokens / (block x d)) + ``state_units`` of them. The
      capacity reported is the engine's log line: the pool over one request of the model's
      maximum length (with ``report_units`` fixed: a sliding window's pages of a whole prefill
      chunk, where a running request keeps its window's), times that length;
    - SPLIT (SGLang): state slots = budget x r / (1 + r) // state (or as launched), the KV pool
      the rest (x d: DCP stripes tokens, not state); at most slots // ``state_units``
      requests run (// 1 with the prefix cache off), within SGLang's own limits.

    A request of ``n`` tokens takes ``attn x ceil(n / unit_tokens) + fixed`` of the ``units``.
    Returns (units, unit_tokens, attn, fixed, running limit, capacity in tokens, state slots,
    slots per request)."""
    mode = rows[R_MODE, i]
    default = rows[R_DEFAULT_RUNNING, i]
    if mode == PAGED:
        limit = req if req > 0.0 else default
        total = np.floor(kv_budget(K, rows, i, limit) / rows[R_UNIT, i])
        au, blk = rows[R_ATTN_UNITS, i], rows[R_BLOCK, i]
        L = K[MAX_LEN]
        cap = np.floor(max(total, 0.0) / (au * np.ceil(np.ceil(L / d) / blk)
                                          + rows[R_REPORT_UNITS, i]) * L)
        return (total - 1.0, blk * d, au, rows[R_STATE_UNITS, i], limit, cap, 0.0, 0.0)
    if mode == SPLIT:
        unit, r = rows[R_UNIT, i], rows[R_RATIO, i]
        div = 1.0 if no_prefix else rows[R_STATE_UNITS, i]
        rest = kv_budget(K, rows, i, 0.0)
        if slots_req > 0.0:
            slots = slots_req
        elif no_prefix and req > 0.0:
            slots = req
        else:
            slots = np.floor(max(rest, 0.0) * r / (1.0 + r) / unit)
        tokens = max(_floor_div(rest - slots * unit, K[KV_GPU_TOKEN]), 0.0)
        estimate = min(max(np.floor(tokens / K[MAX_LEN] * 512.0), ESTIMATE_LO), ESTIMATE_HI)
        limit = min(req if req > 0.0 else estimate, np.floor(tokens / 2.0), np.floor(slots / div))
        return (tokens * d, 1.0, 1.0, 0.0, limit, tokens * d, slots, div)
    kv = K[KV_GPU_TOKEN] / d
    limit = req if req > 0.0 else default
    budget = kv_budget(K, rows, i, limit)
    cap = _floor_div(budget, kv) if budget > 0.0 else 0.0
    other = K[WINDOW_GPU] + rows[R_STATE, i]
    fixed = other / kv if kv > 0.0 else 0.0
    return (cap, 1.0, 1.0, fixed, limit, cap, 0.0, 0.0)


@njit(cache=True)
def memory_fit(K, rows, i, b, c, o, d, s):
    """Row ``i``'s memory at ``b`` sequences of ``c`` + ``o`` tokens, DCP ``d``, a share ``s``
    of each prompt cached (held once): its engine's pool (``pool_of``) with the knobs as
    launched, or with ``R_ADVISE`` chosen for the workload where they let more of it run:
    vLLM's ``--max-num-seqs`` (the sequences that fit: the sampler's profiled rows and the
    CUDA graphs follow it) and, past the engines' default limit, either engine's running
    limit; SGLang's state slots sized to the batch (``--disable-radix-cache
    --max-running-requests n`` without prefix reuse, ``--max-mamba-cache-size 5n
    --max-running-requests n`` with it).

    Returns (sequences at once, capacity in tokens, one fits, the memory holds them all, what
    binds (LIMIT_*), knob (KNOB_*), running limit as launched or advised (0: the default),
    state slots, and the sequences at once, capacity and what binds with the engine's default
    knobs)."""
    mode = rows[R_MODE, i]
    # a linear-attention state per sequence: else the units beside a request's KV pages or
    # slots are its sliding windows' KV, and what they bind is KV (_binds)
    stateful = rows[R_STATE, i] > 0.0
    req, slots_req = rows[R_MAX_RUNNING, i], rows[R_SLOTS, i]
    no_prefix = rows[R_NO_PREFIX, i] > 0.0
    shared = s * c
    knob = KNOB_NONE
    run0, cap0, bind0 = -1.0, 0.0, LIMIT_NONE
    if rows[R_ADVISE, i] > 0.0 and req <= 0.0:
        units, unit, au, fixed, limit, cap, slots, div = pool_of(K, rows, i, d, 0.0, 0.0,
                                                                 False)
        attn = au * np.ceil((c - shared + o) / unit)
        each = attn + fixed
        fit = min(max(np.floor((units - au * np.ceil(shared / unit)) / each), 0.0), b)
        run0, cap0 = min(fit, limit), min(cap, float(2 ** 62))
        bind0 = _binds(mode, run0, fit, b, attn, fixed, slots, div, stateful)
        if mode == PAGED:
            # the limit at what fits; fewer profiled sequences leave the pool a little more
            req, knob = max(fit, 1.0), KNOB_RUNNING
            units = pool_of(K, rows, i, d, req, 0.0, False)[0]
            more = min(b, np.floor((units - au * np.ceil(shared / unit)) / each))
            if more > req:
                units = pool_of(K, rows, i, d, more, 0.0, False)[0]
                if np.floor((units - au * np.ceil(shared / unit)) / each) >= more:
                    req = more
        elif mode == SPLIT and run0 < b:
            # each running request: its state slots and its KV; a shared prefix's KV once
            keep = s > 0.0                     # prefix reuse wanted: the radix cache stays
            per = (div if keep else 1.0) * rows[R_UNIT, i] + (c - shared + o) * K[
                KV_GPU_TOKEN] / d
            n = min(b, np.floor((kv_budget(K, rows, i, 0.0) - shared * K[KV_GPU_TOKEN] / d)
                                / per))
            if n > run0:
                req = n
                if keep:
                    knob, slots_req = KNOB_SLOTS, n * div
                else:
                    knob, no_prefix = KNOB_NO_PREFIX, True
        elif mode != SPLIT and b > limit:
            req, knob = b, KNOB_RUNNING
    units, unit, au, fixed, limit, cap, slots, div = pool_of(K, rows, i, d, req, slots_req,
                                                             no_prefix)
    attn = au * np.ceil((c - shared + o) / unit)
    fit = min(max(np.floor((units - au * np.ceil(shared / unit)) / (attn + fixed)), 0.0), b)
    mem = min(fit, np.floor(slots / div)) if mode == SPLIT else fit
    run = min(fit, limit)
    bind = _binds(mode, run, fit, b, attn, fixed, slots, div, stateful)
    cap = min(cap, float(2 ** 62))
    if run0 < 0.0:
        run0, cap0, bind0 = run, cap, bind
    shown = limit if knob != KNOB_NONE or rows[R_MAX_RUNNING, i] > 0.0 else 0.0
    return (run, cap, 1.0 if run >= 1.0 else 0.0, 1.0 if mem >= b else 0.0, bind, knob, shown,
            slots, run0, cap0, bind0)


@njit(cache=True, inline="always")
def _binds(mode, run, fit, b, attn, fixed, slots, div, stateful):
    """What binds ``run`` of ``b`` sequences (LIMIT_*): none when all run; the memory when it
    holds no more (the pool's KV or, in vLLM's pages, the state when it takes the larger
    share of a request's pages; SGLang's state slots); else the running-request limit. A
    model without linear-attention state (``stateful`` false) has only KV in its pools: its
    sliding windows' pages and SGLang's SWA pool bind as KV."""
    if run >= b:
        return LIMIT_NONE
    memory = LIMIT_STATE if stateful else LIMIT_KV
    if run >= fit:
        return LIMIT_KV if mode != PAGED or attn >= fixed else memory
    if mode == SPLIT and run >= np.floor(slots / div):
        return memory
    return LIMIT_RUNNING
