"""Time to first token, and time per output token, when requests arrive one by one beside a
running batch.

``prefill_s`` of a prediction is the batch's TTFT: every prompt of the batch arrives at once and
the last one's first token waits for all of them (an offline batch, or the first wave of a
benchmark). An online instance that keeps ``B`` sequences in flight admits a request as another
finishes (continuous batching), so after the first wave requests arrive one at a time. Such a
request, on average:

1. waits for the decode step in flight to end: half a step (``tpot(B) / 2``) when other
   sequences are decoding, none when it is alone (``B = 1``);
2. waits for the prefills of requests that arrived before it: the instance's prefill work is a
   queue with deterministic service ``p`` (one prompt's prefill at batch 1, its fixed costs
   included) and arrivals at the rate the other ``B - 1`` sequences finish,
   ``lam = (B - 1) / (p + D)`` with ``D`` the decode span below; the mean wait of an M/D/1
   queue is ``rho p / (2 (1 - rho))`` with ``rho = lam p`` (arrivals of a closed loop are
   smoother than Poisson, so this errs long);
3. is prefilled: ``p``.

In a closed loop ``rho = 1 - (output - 1) tpot(B) / D < 1``: more arrivals stretch the decode
rather than outrun the prefills. Only a single-token output (no decode) has no steady state, an
infinite TTFT. The engines' schedulers differ in whether an arriving prompt's chunk rides in
a decode step (vLLM) or in a prefill pass of its own (SGLang); both cost about ``p`` on top of
the decode work.

The same arrivals stretch a request's decode: benchmark clients measure TPOT as
``(E2E - TTFT) / (output - 1)``, and the prefills of the requests that arrive while it decodes
hold its steps back (SGLang runs them as passes of their own; vLLM folds their chunks into the
steps, which then take as long). Over its decode span ``D`` the ``B - 1`` others, each
finishing once per cycle ``p + D``, bring ``(B - 1) D / (p + D)`` prefills of ``p`` each:
``D = (output - 1) tpot(B) + (B - 1) p D / (p + D)``, a quadratic in ``D``; the measured TPOT is
``D / (output - 1)``.
"""

from __future__ import annotations

import math


def _decode_span_s(p: float, tpot_s: float, steps: int, others: int) -> float:
    """A request's decode span ``D`` beside ``others`` arriving one by one (module docstring):
    the positive root of ``D^2 + (p - others p - s) D - s p = 0`` with ``s = steps tpot``."""
    s = steps * tpot_s
    if others == 0 or p == 0.0 or steps == 0:
        return s
    b = p - others * p - s
    return (-b + math.sqrt(b * b + 4.0 * s * p)) / 2.0


def arrival_ttft_s(prefill_one_s: float, tpot_s: float, output_tokens: int,
                   concurrency: int) -> float:
    """Mean seconds to the first token of a request arriving alone at an instance holding
    ``concurrency`` sequences in flight (module docstring); ``inf`` when its prefills cannot
    keep up."""
    p = max(prefill_one_s, 0.0)
    others = max(concurrency - 1, 0)
    if others == 0:
        return p
    cycle = p + _decode_span_s(p, tpot_s, max(output_tokens - 1, 0), others)
    rho = others * p / cycle if cycle > 0 else math.inf
    if rho >= 1.0:
        return math.inf
    return tpot_s / 2.0 + rho * p / (2.0 * (1.0 - rho)) + p


def arrival_tpot_s(prefill_one_s: float, tpot_s: float, output_tokens: int,
                   concurrency: int) -> float:
    """Time per output token a benchmark client measures for a request decoding beside
    ``concurrency - 1`` others that arrive one by one: the decode step ``tpot_s`` plus the
    share of the others' prefills that land in its decode span (module docstring)."""
    steps = max(output_tokens - 1, 0)
    if steps == 0:
        return tpot_s
    return _decode_span_s(max(prefill_one_s, 0.0), tpot_s, steps,
                          max(concurrency - 1, 0)) / steps
