"""TTFT of a request arriving alone beside a running batch (model/predict/arrivals.py)."""

from __future__ import annotations

import math

import pytest

from model.predict.arrivals import arrival_ttft_s


def test_alone_it_is_one_prefill():
    assert arrival_ttft_s(0.2, 0.01, 1024, 1) == pytest.approx(0.2)


def test_beside_others_half_a_step_and_the_md1_queue():
    p, tpot, out, b = 0.1, 0.02, 1001, 11
    rho = 10 * p / (p + 1000 * tpot)
    want = tpot / 2 + rho * p / (2 * (1 - rho)) + p
    assert arrival_ttft_s(p, tpot, out, b) == pytest.approx(want)
    assert arrival_ttft_s(p, tpot, out, b) > arrival_ttft_s(p, tpot, out, b - 5) > p


def test_prefills_that_cannot_keep_up_have_no_steady_state():
    # 100 others finishing every 1.1 s, each needing 0.1 s of prefill: rho = 9
    assert math.isinf(arrival_ttft_s(0.1, 0.001, 1001, 101))


def test_tpot_alone_is_the_step_and_beside_others_carries_their_prefills():
    from model.predict.arrivals import arrival_tpot_s

    assert arrival_tpot_s(0.2, 0.01, 1001, 1) == pytest.approx(0.01)
    p, tpot, out, b = 0.2, 0.02, 1001, 64
    t = arrival_tpot_s(p, tpot, out, b)
    span = t * (out - 1)
    # the span holds its own steps and the prefills of the others arriving during it
    assert span == pytest.approx((out - 1) * tpot + (b - 1) * p * span / (p + span), rel=1e-9)
    assert tpot < t < tpot + (b - 1) * p / (out - 1)
    assert arrival_tpot_s(p, tpot, out, 8) < t
