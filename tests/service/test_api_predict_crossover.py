"""POST /v1/predict and /v1/crossover (in-process)."""

from __future__ import annotations

import pytest
from svc_helpers import SEED, assert_error

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.queries import evaluate
from engine_advisor.model.workload import Config, Workload

NO_CTX = {k: v for k, v in SEED.items() if k != "context_tokens"}


@pytest.mark.parametrize("engine, dcp, published", [("vllm", 1, 295.2), ("sglang", 8, 225.3)])
def test_predict_matches_evaluate_and_the_seed(client, engine, dcp, published):
    r = client.post("/v1/predict", json={"workload": SEED, "engine": engine, "dcp_size": dcp})
    assert r.status_code == 200, r.text
    body = r.json()
    m = default_model()
    w = Workload.model_validate(SEED)
    e = evaluate(m, w, [Config(engine, dcp)])[0]
    assert body["prediction"] == e.pred.model_dump(mode="json")
    assert body["model_version"] == m.version
    p = body["prediction"]
    assert p["interval_s"][0] < p["total_s"] < p["interval_s"][1]
    assert p["total_s"] == pytest.approx(published, rel=0.05)
    assert sum(body["decode_step_s"].values()) == pytest.approx(p["tpot_s"])


def test_predict_uncalibrated_config_is_marked(client):
    r = client.post("/v1/predict", json={"workload": SEED, "engine": "vllm", "dcp_size": 8})
    assert r.status_code == 200
    assert r.json()["prediction"]["calibrated"] is False


def test_predict_applies_prefix_reuse(client):
    distinct = {k: v for k, v in SEED.items() if k != "requirements"}
    base = client.post("/v1/predict", json={"workload": distinct, "engine": "sglang",
                                            "dcp_size": 8})
    reuse = client.post("/v1/predict", json={
        "workload": {**distinct, "requirements": {"prefix_reuse_share": 0.5}},
        "engine": "sglang", "dcp_size": 8})
    assert reuse.json()["prediction"]["prefill_s"] < base.json()["prediction"]["prefill_s"]


@pytest.mark.parametrize("body, status, param, contains", [
    ({"workload": SEED, "engine": "vllm", "dcp_size": 3}, 422, "dcp_size", "does not divide"),
    ({"workload": SEED, "engine": "trt", "dcp_size": 1}, 422, "engine", "vllm"),
    ({"workload": SEED, "engine": "vllm", "dcp_size": 0}, 422, "dcp_size", "greater than 0"),
    ({"engine": "vllm", "dcp_size": 1}, 422, "workload", "required"),
    ({"workload": {**SEED, "context_tokens": 0}, "engine": "vllm", "dcp_size": 1}, 422,
     "workload.context_tokens", "greater than 0"),
    ({"workload": {**SEED, "kv_bytes_per_token": None, "preset": "llama-3.1-70b"},
      "engine": "sglang", "dcp_size": 2}, 422, "dcp_size", "GQA"),
    ({"workload": {**SEED, "requirements": {"hardware_vendor": "tpu"}}, "engine": "sglang",
      "dcp_size": 8}, 422, "engine", "tpu"),
])
def test_predict_bad_inputs(client, body, status, param, contains):
    if "workload" in body:
        body = {**body, "workload": {k: v for k, v in body["workload"].items() if v is not None}}
    assert_error(client.post("/v1/predict", json=body), status, param=param, contains=contains)


# -------------------------------------------------------------- crossover
def test_crossover_of_the_seed_workload(client):
    r = client.post("/v1/crossover", json=NO_CTX)
    assert r.status_code == 200, r.text
    body = r.json()
    x = body["crossover_context_tokens"]
    # a linear fit through the published points crosses near 122K tokens
    assert 100_000 < x < 150_000
    first = body["engine_crossovers"][0]
    assert first["before"] == {"engine": "vllm", "dcp_size": 1}
    assert first["after"] == {"engine": "sglang", "dcp_size": 8}
    assert len(body["points"]) == 16
    assert body["points"][0] == 1024 and body["points"][-1] == 4 * 1024 * 1024
    assert {(c["engine"], c["dcp_size"]) for c in body["curves"]} == {("vllm", 1), ("sglang", 8)}
    for c in body["curves"]:
        assert len(c["total_s"]) == 16
        fits = [t for t in c["total_s"] if t is not None]   # None: not one sequence fits
        assert fits == sorted(fits) and len(fits) >= 12      # longer context, longer time
    # the best configuration per point agrees with the curves and flips once
    for i, best in enumerate(body["best"]):
        times = {(c["engine"], c["dcp_size"]): c["total_s"][i] for c in body["curves"]
                 if c["total_s"][i] is not None}
        assert times[(best["engine"], best["dcp_size"])] == min(times.values())
    assert body["best"][0]["engine"] == "vllm" and body["best"][-1]["engine"] == "sglang"


def test_crossover_at_requested_points_and_none_in_range(client):
    r = client.post("/v1/crossover", json={**NO_CTX, "context_range": [1024, 32768],
                                           "points": [65_536, 2048, 204_800, 2048]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["crossover_context_tokens"] is None
    assert body["engine_crossovers"] == []
    assert body["points"] == [2048, 65_536, 204_800]
    best = [b["engine"] for b in body["best"]]
    assert best == ["vllm", "vllm", "sglang"]


def test_crossover_curves_apply_prefix_reuse(client):
    distinct = {k: v for k, v in NO_CTX.items() if k != "requirements"}
    base = client.post("/v1/crossover", json=distinct).json()
    reuse = client.post("/v1/crossover", json={
        **distinct, "requirements": {"prefix_reuse_share": 0.8}}).json()
    assert [c["engine"] for c in reuse["curves"]] == [c["engine"] for c in base["curves"]]
    for b, r in zip(base["curves"], reuse["curves"], strict=True):
        pairs = [(x, y) for x, y in zip(r["total_s"], b["total_s"], strict=True)
                 if x is not None and y is not None]
        assert pairs and all(x < y for x, y in pairs)


def test_crossover_on_uncalibrated_hardware_compares_the_priors(client):
    r = client.post("/v1/crossover", json={**NO_CTX, "gpu": "GB300"})
    assert r.status_code == 200, r.text
    curves = r.json()["curves"]
    assert curves and not any(c["calibrated"] for c in curves)


def test_crossover_with_extrapolation_compares_all_configs(client):
    r = client.post("/v1/crossover", json={**NO_CTX, "allow_extrapolation": True})
    assert r.status_code == 200
    assert len(r.json()["curves"]) == 8


@pytest.mark.parametrize("patch, param, contains", [
    ({"context_tokens": 65_536}, "context_tokens", "sweeps the context"),
    ({"context_range": [5000, 5000]}, None, "must be below"),
    ({"context_range": [0, 5000]}, "context_range.0", "greater than 0"),
    ({"points": []}, "points", "at least 1"),
    ({"points": [1] * 257}, "points", "at most 256"),
    ({"points": [99_999_999]}, "points.0", "less than or equal"),
    ({"preset": "deepseek-v3", "gpu": "H100"}, "num_gpus", "its weights take 84.1 GB per GPU"),
    ({"preset": "llama-3.1-70b", "gpu": "H100", "num_gpus": 2,
      "context_range": [1_000_000, 2_000_000]}, "context_range", "no configuration to compare "
     "at 1,000,000 context tokens: the model does not fit on H100 x 2: one sequence"),
    ({"requirements": {"hardware_vendor": "intel"}}, "requirements", "intel"),
])
def test_crossover_bad_inputs(client, patch, param, contains):
    assert_error(client.post("/v1/crossover", json={**NO_CTX, **patch}), 422, param=param,
                 contains=contains)
