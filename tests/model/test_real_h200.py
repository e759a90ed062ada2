"""The default model against the real vLLM 0.26.0 and SGLang 0.5.16 runs on one H200 it ships
with (model/data/h200_real.csv): every figure held out (model.validation)."""

import pytest

from model.fit.default import default_model, real_rows
from model.validation import summary


@pytest.fixture(scope="module")
def s():
    return summary(default_model(), real_rows())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("quantity,limit", [("total", 0.10), ("ttft", 0.10), ("step", 0.15)])
def test_held_out_error_within_target_and_below_the_prior(s, engine, quantity, limit):
    e = s["errors"][f"{engine}/{quantity}"]
    assert e["points"] >= 16
    assert e["held_out"] <= limit
    assert e["held_out"] < e["prior"]


def test_no_point_group_is_worse_than_the_prior(s):
    """Per engine, model and quantity, the median held-out error is never above the prior's."""
    for g in s["groups"]:
        assert g["held_out"] <= g["prior"] + 1e-9, g


def test_kv_capacity_within_3_percent_of_the_engines_logs(s):
    assert {(c["engine"], c["model"]) for c in s["capacity"]} == {
        (e, m) for e in ("vllm", "sglang") for m in ("deepseek-v2-lite", "llama-3.1-8b")}
    for c in s["capacity"]:
        assert abs(c["error"]) <= 0.03, c


def test_the_faster_engine_is_picked_and_the_ratio_is_right(s):
    c = s["choice"]
    assert c["points"] >= 30
    assert c["share_right"] >= 0.90
    assert c["differing_points"] >= 5 and c["ratio_median_factor"] <= 1.15
    # the uncalibrated prior could not tell the engines apart
    assert s["choice_prior"]["share_right"] < c["share_right"]


def test_the_uncalibrated_prior_holds_against_the_real_runs(s):
    """Issue 26's bar for the prior on real runs: geometric-mean ratio within 1.15, at least
    85 % of figures within 2x, and every batch prefill within 2x but the one measurement stall
    (SGLang's DeepSeek-V2-Lite at 16K, slower than its 32K point: a one-off, not physics)."""
    r = s["prior_ratios"]
    assert r["figures"] >= 180
    assert 1 / 1.15 <= r["geomean"] <= 1.15
    assert r["within_2x"] >= 0.85
    assert r["ttft_outside_2x"] <= 1


def test_held_out_intervals_cover_ninety_percent(s):
    assert s["coverage"] and all(v >= 0.90 for v in s["coverage"].values())


def test_random_weight_routing_is_named_for_the_engine_that_shows_it():
    """vLLM's decode at batch 64 on random weights is faster than reading every routed expert
    once takes: its rows route far fewer apart than a trained router; SGLang's as physics."""
    m = default_model()
    assert m.diversity.get("vllm", 1.0) < 0.2
    assert m.diversity.get("sglang", 1.0) == 1.0
