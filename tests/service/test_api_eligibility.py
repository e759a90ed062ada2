"""POST /v1/recommend says which predictions the recommendation could choose (``eligible``,
``ineligible_reason``) and which one its speed-up is over (``speedup_over``): the compared
configuration is eligible, and every configuration faster than the recommended one is not,
with a reason. The page (service/ui/recommend.js) shows these fields as they are."""

from __future__ import annotations

import pytest
from svc_helpers import SEED

CASES = {
    # vLLM and SGLang dcp 2 and 4 beat vLLM dcp 1 without calibration data on B300 x 8
    "calibrated-only": SEED,
    "allow-extrapolation": {**SEED, "allow_extrapolation": True},
    # dcp 1 holds no sequence of 3M tokens; nothing eligible to compare with
    "3M-context": {**SEED, "context_tokens": 3_000_000},
    "prior": {**SEED, "gpu": "GB300", "context_tokens": 65_536},   # nothing calibrated there
    "one-engine": {**SEED, "engines": ["vllm"]},
    "kv-bytes-only": {"context_tokens": 16_384, "output_tokens": 256, "batch_size": 8,
                      "kv_bytes_per_token": 27_648, "gpu": "H200", "num_gpus": 1},
}


def check(body: dict) -> None:
    """The invariants of an answer's eligibility fields."""
    preds = {(p["engine"], p["dcp_size"]): p for p in body["predictions"]}
    best = preds[(body["engine"], body["dcp_size"])]
    assert best["eligible"] and best["ineligible_reason"] is None
    for p in body["predictions"]:
        assert p["eligible"] == (p["ineligible_reason"] is None), p
        if p["total_s"] < best["total_s"]:       # faster, so it was not allowed
            assert not p["eligible"], p
            assert isinstance(p["ineligible_reason"], str) and p["ineligible_reason"], p
    excluded = {(x["engine"], x.get("dcp_size")): x["reason"] for x in body["excluded"]}
    for key, p in preds.items():
        if p["running_sequences"] == 0:          # holds no sequence: the exclusion's words
            assert not p["eligible"] and p["ineligible_reason"] == excluded[key]
    eligible = [p for p in body["predictions"] if p["eligible"] and p is not best]
    over = body["speedup_over"]
    if over is None:
        assert body["speedup"] is None and not eligible
        return
    rival = preds[(over["engine"], over["dcp_size"])]
    assert rival["eligible"] and rival is not best
    assert rival["total_s"] / best["total_s"] == pytest.approx(body["speedup"], rel=1e-12)
    # the fastest eligible configuration of another engine, else the next-fastest eligible one
    others = [p for p in eligible if p["engine"] != best["engine"]] or eligible
    assert rival is min(others, key=lambda p: p["total_s"])


@pytest.mark.parametrize("case", CASES)
def test_speedup_is_over_an_eligible_configuration(client, case):
    r = client.post("/v1/recommend", json=CASES[case])
    assert r.status_code == 200, r.text
    body = r.json()
    check(body)
    if case == "calibrated-only":       # the case the fields are for
        fast = [p for p in body["predictions"] if not p["eligible"] and p["total_s"]
                < next(q["total_s"] for q in body["predictions"]
                       if (q["engine"], q["dcp_size"]) == (body["speedup_over"]["engine"],
                                                           body["speedup_over"]["dcp_size"]))]
        assert fast and all(p["ineligible_reason"] == "not calibrated on B300 x 8 "
                            "(allow_extrapolation to consider it)" for p in fast)
    if case == "allow-extrapolation":
        assert all(p["eligible"] for p in body["predictions"])
    if case == "3M-context":
        assert body["speedup_over"] is None
        assert any(p["running_sequences"] == 0 for p in body["predictions"])


def test_batch_answers_carry_the_same_fields(client):
    r = client.post("/v1/recommend/batch", json={"workloads": list(CASES.values())})
    assert r.status_code == 200, r.text
    for item, case in zip(r.json()["results"], CASES, strict=True):
        assert item["recommendation"], case
        check(item["recommendation"])
        single = client.post("/v1/recommend", json=CASES[case]).json()
        assert item["recommendation"] == single
