"""Capacity planning (model/plan.py): the queueing arithmetic and the choice of concurrency."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.plan import PlanRequest, plan
from engine_advisor.model.predict.arrivals import arrival_tpot_s
from engine_advisor.model.queries import evaluate
from engine_advisor.model.workload import Config

BASE = {"kv_bytes_per_token": 70272, "gpu": "B300", "gpus_per_node": 8}
LONG = {"name": "long", "context_tokens": 204_800, "output_tokens": 2048,
        "requests_per_second": 0.5}
SHORT = {"name": "short", "context_tokens": 65_536, "output_tokens": 2048,
         "requests_per_second": 2.0}


def run(**kw):
    m = default_model()
    req = PlanRequest.model_validate({**BASE, **kw})
    return m, req, plan(m, req, m.version)


def at(m, req, cls, engine, dcp, batch):
    w = req.workload(req.classes[cls]).model_copy(update={"batch_size": batch})
    return evaluate(m, w, [Config(engine, dcp)])[0].pred


def test_littles_law_and_maximal_concurrency():
    m, req, out = run(classes=[LONG, SHORT], slo={"max_tpot_s": 0.05})
    assert out.unserved == []
    assert [c.name for c in out.classes] == ["long", "short"]
    for c in out.classes:
        rps = req.classes[c.index].requests_per_second
        assert c.instances == math.ceil(rps * c.predicted_e2e_s / (c.concurrency * req.headroom))
        assert c.utilisation <= req.headroom + 1e-9
        assert c.nodes == c.instances and c.gpus == c.instances * 8
        assert c.instance_requests_per_s == pytest.approx(c.concurrency / c.predicted_e2e_s)
        assert c.output_tokens_per_s_per_gpu == pytest.approx(
            c.instance_requests_per_s * c.output_tokens / 8)
        # B meets the SLO and fits in KV; B + 1 does not (or hits the KV capacity). The TPOT is
        # a client's: the step and the prefills of requests arriving while it decodes
        p1 = at(m, req, c.index, c.engine, c.dcp_size, 1)
        p = at(m, req, c.index, c.engine, c.dcp_size, c.concurrency)
        tpot = arrival_tpot_s(p1.prefill_s, p.tpot_s, c.output_tokens, c.concurrency)
        assert tpot <= 0.05 and tpot == pytest.approx(c.predicted_tpot_s)
        assert c.predicted_tpot_s >= p.tpot_s
        assert c.concurrency * (c.context_tokens + c.output_tokens) <= c.kv_capacity_tokens
        nxt = at(m, req, c.index, c.engine, c.dcp_size, c.concurrency + 1)
        over_kv = (c.concurrency + 1) * (c.context_tokens + c.output_tokens) > c.kv_capacity_tokens
        assert arrival_tpot_s(p1.prefill_s, nxt.tpot_s, c.output_tokens,
                              c.concurrency + 1) > 0.05 or over_kv
        assert c.limited_by == ("kv_capacity" if over_kv else "slo_tpot")
        assert c.engine in c.launch_command[0] + " ".join(c.launch_command)
        assert str(c.concurrency) in c.launch_command
    assert out.total_nodes == sum(c.nodes for c in out.classes)
    assert out.total_gpus == out.total_nodes * 8
    assert any("Little's law" in a for a in out.assumptions)


def test_more_traffic_needs_proportionally_more_instances():
    _, _, one = run(classes=[{**SHORT, "requests_per_second": 1.0}], slo={"max_tpot_s": 0.05})
    _, _, ten = run(classes=[{**SHORT, "requests_per_second": 10.0}], slo={"max_tpot_s": 0.05})
    a, b = one.classes[0], ten.classes[0]
    assert (a.engine, a.dcp_size, a.concurrency) == (b.engine, b.dcp_size, b.concurrency)
    assert b.instances >= 10 * (a.instances - 1)   # a's count is rounded up


def test_tighter_slo_lowers_concurrency_and_raises_instances():
    _, _, loose = run(classes=[SHORT], slo={"max_tpot_s": 0.05})
    _, _, tight = run(classes=[SHORT], slo={"max_tpot_s": 0.03})
    assert tight.classes[0].concurrency < loose.classes[0].concurrency
    assert tight.classes[0].instances >= loose.classes[0].instances
    assert tight.classes[0].predicted_tpot_s <= 0.03
    assert tight.classes[0].limited_by == "slo_tpot"


def test_e2e_slo_is_met():
    _, _, out = run(classes=[SHORT], slo={"max_e2e_s": 60.0})
    c = out.classes[0]
    assert c.predicted_e2e_s <= 60.0
    assert c.limited_by in ("slo_e2e", "kv_capacity")


def test_headroom_scales_instances():
    _, _, full = run(classes=[SHORT], slo={"max_tpot_s": 0.05}, headroom=1.0)
    _, _, half = run(classes=[SHORT], slo={"max_tpot_s": 0.05}, headroom=0.5)
    assert half.classes[0].instances >= 2 * full.classes[0].instances - 1


def test_unservable_classes_are_reported_with_the_reason():
    huge = {"name": "huge", "context_tokens": 8_000_000, "output_tokens": 16,
            "requests_per_second": 1}
    _, _, out = run(classes=[SHORT, huge], slo={"max_tpot_s": 0.001})
    assert out.classes == []
    names = {u.name: u.reason for u in out.unserved}
    assert "misses the SLO" in names["short"]
    # in /v1/recommend's words (the prediction's ineligible_reason)
    assert "vllm dcp 1: not even one sequence of 8,000,016 tokens fits its KV capacity of" \
        in names["huge"]
    assert out.total_nodes == 0


def test_requirements_and_max_concurrency_are_honoured():
    _, _, out = run(classes=[LONG], slo={"max_tpot_s": 0.2}, max_concurrency=4,
                    requirements={"pipeline_parallel": True, "speculative_method": "mtp"})
    c = out.classes[0]
    assert c.engine == "sglang" and c.concurrency <= 4
    assert all(a.engine == "sglang" for a in c.alternatives)


@pytest.mark.parametrize("patch, text", [
    ({"slo": {}}, "max_tpot_s"),
    ({"classes": []}, "at least 1"),
    ({"classes": [{**SHORT, "requests_per_second": 0}]}, "greater than 0"),
    ({"preset": "kimi-k2"}, "exactly one"),
    ({"headroom": 1.5}, "less than or equal"),
    ({"gpus_per_node": 8, "dcp_sizes": [3]}, "do not divide"),
])
def test_bad_requests(patch, text):
    with pytest.raises(ValidationError, match=text):
        PlanRequest.model_validate({**BASE, "classes": [SHORT], "slo": {"max_tpot_s": 0.05},
                                    **patch})


def test_ttft_slo_bounds_concurrency_by_the_arrival_queue():
    """TTFT of a request arriving beside the others grows with the concurrency (a longer step
    to wait for, more prefills queued ahead): a tight bound lowers B, names TTFT as the limit,
    and B + 1 would miss it."""
    from engine_advisor.model.plan import _latencies
    from engine_advisor.model.queries import evaluate as ev

    _, _, loose = run(classes=[SHORT], slo={"max_tpot_s": 0.05})
    lc = loose.classes[0]
    assert lc.predicted_ttft_s > 0
    bound = lc.predicted_ttft_s * 0.8
    m, req, out = run(classes=[SHORT], slo={"max_tpot_s": 0.05, "max_ttft_s": bound})
    c = out.classes[0]
    assert c.predicted_ttft_s <= bound
    if (c.engine, c.dcp_size) == (lc.engine, lc.dcp_size):
        assert c.concurrency < lc.concurrency
    assert c.limited_by in ("slo_ttft", "kv_capacity", "slo_tpot")
    w = req.workload(req.classes[0])
    e1 = ev(m, w, [Config(c.engine, c.dcp_size)])[0]
    w2 = w.model_copy(update={"batch_size": c.concurrency + 1})
    e2 = ev(m, w2, [Config(c.engine, c.dcp_size)])[0]
    if c.limited_by == "slo_ttft":
        assert _latencies(e2, e1, w, c.concurrency + 1)[1] > bound
    # below one prompt's prefill nothing can serve it
    _, _, none = run(classes=[SHORT], slo={"max_ttft_s": 1e-4})
    assert none.classes == [] and "TTFT" in none.unserved[0].reason


def test_a_pool_beyond_any_size_is_unserved_not_an_overflow():
    """A headroom near 0 (any positive value is valid) asks for an astronomic pool: the class
    is unserved with the arithmetic, not an OverflowError."""
    _, _, out = run(classes=[SHORT], slo={"max_tpot_s": 0.05}, headroom=5e-324)
    assert out.classes == [] and "instances" in out.unserved[0].reason
