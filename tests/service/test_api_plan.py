"""POST /v1/plan (in-process): the route returns engine_advisor.model.plan's result."""

from __future__ import annotations

import pytest
from svc_helpers import assert_error

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.plan import PlanRequest, plan

BODY = {"classes": [{"name": "chat", "context_tokens": 65_536, "output_tokens": 2048,
                     "requests_per_second": 3},
                    {"name": "long-docs", "context_tokens": 204_800, "output_tokens": 2048,
                     "requests_per_second": 0.25}],
        "gpu": "B300", "gpus_per_node": 8, "kv_bytes_per_token": 70272,
        "slo": {"max_tpot_s": 0.05, "max_e2e_s": 200}}


def test_plan_success(client):
    r = client.post("/v1/plan", json=BODY)
    assert r.status_code == 200, r.text
    body = r.json()
    m = default_model()
    assert body == plan(m, PlanRequest.model_validate(BODY), m.version).model_dump(mode="json")
    assert body["total_nodes"] == sum(c["nodes"] for c in body["classes"]) > 0
    for c in body["classes"]:
        assert c["predicted_tpot_s"] <= 0.05 and c["predicted_e2e_s"] <= 200
        assert c["mem_fraction"] == 0.92


def test_plan_reports_unservable_class(client):
    body = {**BODY, "slo": {"max_e2e_s": 1.0}}
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200
    out = r.json()
    assert out["classes"] == [] and len(out["unserved"]) == 2
    assert all("end-to-end" in u["reason"] for u in out["unserved"])


@pytest.mark.parametrize("patch, param, contains", [
    ({"slo": {}}, "slo", "max_tpot_s, max_ttft_s and/or max_e2e_s"),
    ({"slo": {"max_tpot_s": -1}}, "slo.max_tpot_s", "greater than 0"),
    ({"classes": []}, "classes", "at least 1"),
    ({"classes": [{"context_tokens": 10, "output_tokens": 10}]}, "classes.0.requests_per_second",
     "required"),
    ({"kv_bytes_per_token": None}, None, "exactly one"),
    ({"gpu": "TPUv5"}, None, "unknown GPU"),
    ({"gpus_per_node": 0}, "gpus_per_node", "greater than 0"),
    ({"headroom": 0}, "headroom", "greater than 0"),
    ({"classes": [BODY["classes"][0]] * 65}, "classes", "at most 64"),
])
def test_plan_bad_inputs(client, patch, param, contains):
    body = {k: v for k, v in {**BODY, **patch}.items() if v is not None}
    assert_error(client.post("/v1/plan", json=body), 422, param=param, contains=contains)


KV_ONLY = {"classes": [{"context_tokens": 65_536, "output_tokens": 2048,
                        "requests_per_second": 1}],
           "kv_bytes_per_token": 27648, "slo": {"max_tpot_s": 0.05}}   # docs/capacity-planning.md


def _recommend(client, plan_body: dict, **extra) -> dict:
    """/v1/recommend's answer for the plan's first class at batch 1 on one node."""
    c = plan_body["classes"][0]
    body = {k: v for k, v in plan_body.items() if k not in ("classes", "slo", "gpus_per_node")}
    r = client.post("/v1/recommend", json={
        **body, "context_tokens": c["context_tokens"], "output_tokens": c["output_tokens"],
        "batch_size": 1, "num_gpus": plan_body.get("gpus_per_node", 8), **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_plan_says_when_only_kv_bytes_are_known(client):
    """Only KV bytes per token: the plan says so in /v1/recommend's words, says what that
    leaves out of its times, and its confidence is /v1/recommend's (the physics prior's here:
    nothing is calibrated for a model known by its KV bytes alone on 8 x B300)."""
    r = client.post("/v1/plan", json=KV_ONLY)
    assert r.status_code == 200, r.text
    [c] = r.json()["classes"]
    rec = _recommend(client, KV_ONLY)
    kv_only = next(x for x in rec["reasons"] if x.startswith("only KV bytes per token"))
    assert kv_only in c["reasons"]
    assert any("TTFT, TPOT and end-to-end time are lower bounds" in x for x in c["reasons"])
    assert c["confidence"] == rec["confidence"] == "prior"
    assert any(x.startswith("answered from the physics prior: no configuration is calibrated "
                            "on B300 x 8") for x in c["reasons"])
    # vLLM and SGLang answer within 0.5 % (the same efficiencies; only their memory and the
    # kernels each launches per decode step differ): the plan says the prior cannot tell them
    # apart
    same = [a for a in c["alternatives"] if a["dcp_size"] == c["dcp_size"]]
    assert same and same[0]["predicted_e2e_s"] == pytest.approx(c["predicted_e2e_s"], rel=5e-3)
    assert any(x.startswith("the prior gives both engines the same efficiencies")
               for x in c["reasons"])


@pytest.mark.parametrize("engines, want, says", [
    (["vllm"], "medium", "transferred"),
    (["vllm", "sglang"], "low", "low confidence: vllm dcp 1 and sglang dcp 1 need 1 instance "
                                "each and their end-to-end intervals overlap"),
])
def test_plan_confidence_follows_recommend(client, engines, want, says):
    """Only KV bytes per token on 1 x H200, where the engines' efficiencies are fitted (for other
    models): the plan is at most medium, as /v1/recommend is, and low where the rival engine
    needs as many instances with an overlapping interval."""
    body = {**KV_ONLY, "gpu": "H200", "gpus_per_node": 1, "engines": engines,
            "classes": [{"context_tokens": 16_384, "output_tokens": 256,
                         "requests_per_second": 1}]}
    r = client.post("/v1/plan", json=body)
    assert r.status_code == 200, r.text
    [c] = r.json()["classes"]
    assert c["confidence"] == _recommend(client, body)["confidence"] == want, c["reasons"]
    assert c["reasons"][0].startswith("only KV bytes per token")
    assert any(says in x for x in c["reasons"]), c["reasons"]


def test_plan_with_the_model_known_has_no_kv_warning(client):
    r = client.post("/v1/plan", json={**{k: v for k, v in KV_ONLY.items()
                                         if k != "kv_bytes_per_token"}, "preset": "kimi-k3"})
    assert r.status_code == 200, r.text
    [c] = r.json()["classes"]
    assert c["confidence"] in ("medium", "high")
    assert not any("KV bytes per token" in x for x in c["reasons"])
