"""POST /v1/recommend and /v1/recommend/batch (in-process)."""

from __future__ import annotations

import pytest
from svc_helpers import SEED, assert_error, make_client

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload


@pytest.mark.parametrize("context, engine, dcp", [(65_536, "vllm", 1), (204_800, "sglang", 8)])
def test_seed_cases(client, context, engine, dcp):
    r = client.post("/v1/recommend", json={**SEED, "context_tokens": context})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["engine"], body["dcp_size"], body["mem_fraction"]) == (engine, dcp, 0.92)
    m = default_model()
    direct = recommend(m, Workload.model_validate({**SEED, "context_tokens": context}), m.version)
    assert body == direct.model_dump(mode="json")


def test_answer_is_cached_per_model_and_workload(client):
    cache = client.app.state.recommend_cache
    before = cache.hits
    w = {**SEED, "batch_size": 33}
    a = client.post("/v1/recommend", json=w)
    b = client.post("/v1/recommend", json=dict(reversed(list(w.items()))))  # other key order
    assert a.status_code == b.status_code == 200
    assert a.content == b.content
    assert cache.hits == before + 1
    c = client.post("/v1/recommend", json={**SEED, "batch_size": 34})
    assert c.json()["predictions"] != a.json()["predictions"]


def test_requirements_exclude_engines(client):
    r = client.post("/v1/recommend", json={
        **SEED, "requirements": {"pipeline_parallel": True, "speculative_method": "eagle"}})
    assert r.status_code == 200
    body = r.json()
    assert body["engine"] == "sglang"
    assert body["excluded"][0]["engine"] == "vllm"
    assert "speculative" in body["excluded"][0]["reason"]


@pytest.mark.parametrize("patch, param, contains", [
    ({"context_tokens": -1}, "context_tokens", "greater than 0"),
    ({"context_tokens": "lots"}, "context_tokens", "integer"),
    ({"output_tokens": None}, "output_tokens", "required"),
    ({"preset": None}, None, "exactly one of kv_bytes_per_token"),
    ({"kv_bytes_per_token": 27648}, None, "exactly one"),
    ({"gpu": "A4000"}, "gpu", "unknown GPU"),
    ({"num_gpus": 8, "dcp_sizes": [3]}, None, "do not divide"),
    ({"engines": ["tensorrt"]}, "engines.0", "vllm"),
    ({"surprise": 1}, "surprise", "extra"),
    ({"requirements": {"prefix_reuse_share": 1.5}}, "requirements.prefix_reuse_share",
     "less than or equal"),
    ({"gpu": {"name": "X", "memory_bytes": 1, "hbm_bandwidth": 1e12}}, "gpu.memory_bytes",
     "greater than"),
    ({"gpu": 5}, "gpu", "valid string"),
])
def test_bad_workloads_get_422_naming_the_field(client, patch, param, contains):
    body = {**SEED, **patch}
    body = {k: v for k, v in body.items() if v is not None}
    err = assert_error(client.post("/v1/recommend", json=body), 422, contains=contains)
    if param:
        assert err["param"] == param
        assert err["message"].startswith(param)


@pytest.mark.parametrize("body, contains", [
    (b'{"context_tokens": ', "invalid JSON (Expecting value"),
    (b'{"context_tokens": "\xff"}', "cannot be decoded as text"),
    (b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    (b'{"context_tokens": ' + b"9" * 5000 + b"}", "more than 4,300 digits"),
    (b'{"context_tokens": 1, "preset": "\\ud800"}', "lone surrogate \\ud800"),
])
@pytest.mark.parametrize("path", ["/v1/recommend", "/v1/predict", "/v1/plan"])
def test_malformed_json_is_a_400_naming_why(client, path, body, contains):
    assert_error(client.post(path, content=body, headers={"content-type": "application/json"}),
                 400, contains=contains)


def test_invalid_json_and_non_object_bodies(client):
    assert_error(client.post("/v1/recommend", json=[1, 2]), 422, contains="object")
    assert_error(client.post("/v1/recommend"), 422, param="body", contains="required")
    assert_error(client.post("/v1/recommend", content=b"context_tokens=1",
                             headers={"content-type": "text/plain"}), 422)


UNCALIBRATED = {**SEED, "gpu": "GB300", "context_tokens": 65_536}   # fits, no data there
TOO_BIG = {"preset": "deepseek-v3", "gpu": "H100", "num_gpus": 8, "context_tokens": 1024,
           "output_tokens": 128}                                       # 673 GB of weights


def test_uncalibrated_hardware_is_answered_from_the_prior(client):
    r = client.post("/v1/recommend", json=UNCALIBRATED)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["confidence"] == "prior"
    assert not any(p["calibrated"] or p["transferred"] for p in body["predictions"])
    assert any(x.startswith("answered from the physics prior: no configuration is calibrated "
                            "on GB300 x 8") for x in body["reasons"])
    same = client.post("/v1/recommend", json={**UNCALIBRATED, "allow_extrapolation": True})
    assert same.json()["predictions"] == body["predictions"]


def test_a_model_that_does_not_fit_blames_num_gpus_with_numbers(client):
    for flag in (False, True):
        err = assert_error(client.post("/v1/recommend", json={**TOO_BIG,
                                                              "allow_extrapolation": flag}),
                           422, param="num_gpus", contains="its weights take 84.1 GB per GPU")
        assert err["type"] == "no_eligible_configuration"
        assert err["message"].startswith("num_gpus: the model does not fit on H100 x 8")
        assert "allow_extrapolation" not in err["message"]
        assert "num_gpus 16 (16 x H100)" in err["message"]


def test_one_sequence_too_long_blames_context_tokens(client):
    err = assert_error(client.post("/v1/recommend", json={
        "preset": "llama-3.1-70b", "gpu": "H100", "num_gpus": 2, "context_tokens": 1_000_000,
        "output_tokens": 128}), 422, param="context_tokens",
        contains="one sequence of 1,000,128 tokens")
    assert "a sequence of at most" in err["message"]


def test_every_engine_excluded_is_a_422_naming_requirements(client):
    assert_error(client.post("/v1/recommend", json={**SEED, "requirements": {
        "hardware_vendor": "intel"}}), 422, param="requirements", contains="every configuration")


def test_wrong_method_and_unknown_route_use_the_envelope(client):
    assert_error(client.get("/v1/recommend"), 405)
    assert_error(client.post("/v1/recomend", json=SEED), 404)


# ---------------------------------------------------------------- batch
def test_batch_in_order_with_per_item_errors(client):
    items = [{**SEED, "context_tokens": 65_536}, {**SEED, "context_tokens": 0}, "nope",
             TOO_BIG, SEED]
    r = client.post("/v1/recommend/batch", json={"workloads": items})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["succeeded"], body["failed"]) == (2, 3)
    res = body["results"]
    assert [x["index"] for x in res] == [0, 1, 2, 3, 4]
    assert res[0]["recommendation"]["engine"] == "vllm" and res[0]["error"] is None
    assert res[4]["recommendation"]["engine"] == "sglang"
    assert res[1]["recommendation"] is None
    assert res[1]["error"]["param"] == "workloads.1.context_tokens"
    assert res[1]["error"]["message"].startswith("workloads.1.context_tokens:")
    assert res[2]["error"]["param"] == "workloads.2"
    assert res[3]["error"]["param"] == "workloads.3.num_gpus"
    assert res[3]["error"]["message"].startswith("workloads.3.num_gpus: the model does not fit")
    for x in res[1:4]:
        assert set(x["error"]) == {"message", "type", "param", "code"}
        assert x["error"]["code"] == 422


def test_batch_size_cap_is_configurable():
    with make_client(max_batch=3) as c:
        ok = c.post("/v1/recommend/batch", json={"workloads": [SEED] * 3})
        assert ok.status_code == 200
        assert_error(c.post("/v1/recommend/batch", json={"workloads": [SEED] * 4}), 422,
                     param="workloads", contains="4 items exceed the batch limit of 3")


def test_default_batch_cap_is_1000(client):
    assert_error(client.post("/v1/recommend/batch", json={"workloads": [1] * 1001}), 422,
                 param="workloads", contains="limit of 1000")


@pytest.mark.parametrize("body, param", [
    ({"workloads": []}, "workloads"),
    ({"workloads": SEED}, "workloads"),
    ({}, "workloads"),
    ({"workloads": [SEED], "extra": True}, "extra"),
])
def test_batch_bad_envelopes(client, body, param):
    assert_error(client.post("/v1/recommend/batch", json=body), 422, param=param)


def test_a_full_batch_of_1000_is_answered(client):
    items = [{**SEED, "context_tokens": 50_000 + 300 * i} for i in range(1000)]
    r = client.post("/v1/recommend/batch", json={"workloads": items})
    assert r.status_code == 200
    body = r.json()
    assert body["succeeded"] == 1000
    engines = [x["recommendation"]["engine"] for x in body["results"]]
    # vLLM at the short end, SGLang at the long end, one switch in between (the crossover)
    assert engines[0] == "vllm" and engines[-1] == "sglang"
    assert sum(a != b for a, b in zip(engines, engines[1:], strict=False)) == 1


def test_body_parsing_fast_path_reads_what_json_loads_reads():
    """engine_advisor.service.deps.json_body validates a valid body with pydantic's JSON parser: the
    same workload as json.loads + validation (FastAPI's way), over every kind of field."""
    import asyncio
    import json
    from pathlib import Path

    import numpy as np
    from starlette.requests import Request

    from engine_advisor.service.deps import json_body

    def read(raw: bytes) -> Workload:
        async def receive() -> dict:
            return {"type": "http.request", "body": raw, "more_body": False}
        scope = {"type": "http", "method": "POST", "path": "/v1/recommend",
                 "headers": [(b"content-type", b"application/json; charset=utf-8")]}
        return asyncio.run(json_body(Request(scope, receive), Workload))

    hf = json.loads((Path(__file__).parents[2] / "model/data/presets/llama-3.1-8b.json")
                    .read_text())
    hf = hf.get("config", hf)
    rng = np.random.default_rng(5)
    bodies = [{**SEED}, {**SEED, "hf_config": hf, "preset": None, "model": "x/y"},
              {**SEED, "context_tokens": 2048.0, "requirements": {"prefix_reuse_share": 0.25}},
              {**SEED, "dcp_sizes": [1, 8], "engines": ["sglang"], "kv_cache_dtype": "fp8"},
              {**SEED, "gpu": "h200", "allow_extrapolation": True, "num_gpus": 4}]
    bodies += [{**SEED, "context_tokens": int(rng.integers(1, 10**7)),
                "batch_size": int(rng.integers(1, 4096)), "output_tokens": float(n)}
               for n in rng.integers(1, 10**5, 20)]
    for body in bodies:
        body = {k: v for k, v in body.items() if v is not None}
        raw = json.dumps(body).encode()
        assert read(raw) == Workload.model_validate(json.loads(raw))
