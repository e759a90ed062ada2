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
