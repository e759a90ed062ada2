"""TTFT of a request arriving alone beside a running batch (model/predict/arrivals.py)."""

from __future__ import annotations

import math

import pytest

from engine_advisor.model.predict.arrivals import arrival_ttft_s


def test_alone_it_is_one_prefill():
    assert arrival_ttft_s(0.2, 0.01, 1024, 1) == pytest.approx(0.2)


def test_beside_others_half_a_step_and_the_md1_queue():
    from engine_advisor.model.predict.arrivals import arrival_tpot_s

    p, tpot, out, b = 0.1, 0.02, 1001, 11
    span = arrival_tpot_s(p, tpot, out, b) * (out - 1)     # the decode span others stretch
    rho = 10 * p / (p + span)
    want = tpot / 2 + rho * p / (2 * (1 - rho)) + p
    assert arrival_ttft_s(p, tpot, out, b) == pytest.approx(want)
    assert arrival_ttft_s(p, tpot, out, b) > arrival_ttft_s(p, tpot, out, b - 5) > p


def test_a_closed_loop_stretches_its_decode_rather_than_outrun_its_prefills():
    # 100 others, each needing 0.1 s of prefill against a 1 s decode: the decode stretches,
    # rho stays below 1 and the TTFT is long but finite; with no decode at all there is no
    # steady state
    from engine_advisor.model.predict.arrivals import arrival_tpot_s

    ttft = arrival_ttft_s(0.1, 0.001, 1001, 101)
    assert math.isfinite(ttft) and ttft > 0.5
    assert arrival_tpot_s(0.1, 0.001, 1001, 101) > 0.005
    assert math.isinf(arrival_ttft_s(0.1, 0.001, 1, 101))


def test_tpot_alone_is_the_step_and_beside_others_carries_their_prefills():
    from engine_advisor.model.predict.arrivals import arrival_tpot_s

    assert arrival_tpot_s(0.2, 0.01, 1001, 1) == pytest.approx(0.01)
    p, tpot, out, b = 0.2, 0.02, 1001, 64
    t = arrival_tpot_s(p, tpot, out, b)
    span = t * (out - 1)
    # the span holds its own steps and the prefills of the others arriving during it
    assert span == pytest.approx((out - 1) * tpot + (b - 1) * p * span / (p + span), rel=1e-9)
    assert tpot < t < tpot + (b - 1) * p / (out - 1)
    assert arrival_tpot_s(p, tpot, out, 8) < t
