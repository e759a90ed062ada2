"""openapi.yaml matches the app; routes document their errors with the envelope."""

from __future__ import annotations

from pathlib import Path

import yaml

from engine_advisor.service.openapi import DEFAULT_OPENAPI, openapi_yaml

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = {"recommend_one", "recommend_batch", "predict", "crossover", "plan_capacity",
              "get_model", "reload_model", "healthz", "readyz", "metrics", "deploy",
              # the proxy (service/routes/proxy.py, route.py, observations.py)
              "chat_completions", "completions", "list_models", "list_upstreams",
              "reload_upstreams", "route_request", "get_observations",
              "generate"}   # SGLang native, service/proxy/generate.py


def test_openapi_yaml_is_up_to_date():
    assert DEFAULT_OPENAPI == ROOT / "openapi.yaml"
    assert (ROOT / "openapi.yaml").read_text(encoding="utf-8") == openapi_yaml(), (
        "openapi.yaml is stale: run `engine-advisor openapi`")


def test_operations_and_error_responses():
    spec = yaml.safe_load(openapi_yaml())
    ops = {}
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            ops[op["operationId"]] = (path, method, op)
    assert set(ops) == OPERATIONS
    assert "/bench/constant" not in spec["paths"]
    ref = "#/components/schemas/ErrorResponse"
    for name, (_path, method, op) in ops.items():
        if method == "post":
            for code in ("413", "422"):
                schema = op["responses"][code]["content"]["application/json"]["schema"]
                assert schema == {"$ref": ref}, (name, code)
    reload_codes = set(ops["reload_model"][2]["responses"])
    assert {"401", "403", "422"} <= reload_codes
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    assert spec["components"]["schemas"]["ErrorDetail"]["required"] == ["message", "type"]
