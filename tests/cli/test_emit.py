"""``engine-advisor recommend --emit k8s|compose``: deployment files that carry the
recommendation's flags, validated offline against the real schemas (kubernetes-validate's
bundled Kubernetes OpenAPI schemas; the compose spec's JSON schema, vendored in data/)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import seedload
import yaml

from engine_advisor.cli.main import main
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.presentation.deploy import DeployError, DeployOptions, compose, kubernetes
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload

try:
    import kubernetes_validate as kv
except ImportError:  # the schema checks skip; the CLI's own checks still run
    kv = None
CHECK_JSONSCHEMA = Path(sys.executable).with_name("check-jsonschema")
COMPOSE_SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"
K8S_VERSION = "1.32.0"

SEED = ["recommend", *seedload.CLI, "--model-name", "moonshotai/Kimi-K3"]
CASES = [(65536, "vllm", 1, "vllm/vllm-openai", 8000),
         (204800, "sglang", 8, "lmsysorg/sglang", 30000)]


def run(capsys, *args):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def expected(ctx: int):
    w = seedload.workload(ctx, model="moonshotai/Kimi-K3")
    m = default_model()
    return recommend(m, w, m.version), w


def k8s_errors(doc: dict) -> list[str]:
    """Schema errors of one Kubernetes object (strict: unknown fields are errors)."""
    if kv is None:
        pytest.skip("kubernetes-validate not installed")
    try:
        kv.validate(doc, K8S_VERSION, strict=True)
    except kv.ValidationError as exc:
        return [str(exc)]
    return []


def compose_check(tmp_path: Path, data: dict) -> subprocess.CompletedProcess:
    if not CHECK_JSONSCHEMA.exists():
        pytest.skip("check-jsonschema not installed")
    f = tmp_path / "compose.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return subprocess.run([str(CHECK_JSONSCHEMA), "--schemafile", str(COMPOSE_SCHEMA), str(f)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("ctx,engine,dcp,image,port", CASES)
def test_k8s_deployment_and_service(capsys, ctx, engine, dcp, image, port):
    code, out, err = run(capsys, *SEED, "--context-tokens", str(ctx), "--emit", "k8s",
                         "--image-tag", "v0.11.0")
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    for d in docs:
        assert k8s_errors(d) == []
    rec, _ = expected(ctx)
    assert (rec.engine, rec.dcp_size) == (engine, dcp)
    dep, svc = docs
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == f"{image}:v0.11.0"
    assert c["command"] == [*rec.launch_command, "--host", "0.0.0.0", "--port", str(port)]
    cmd = " ".join(c["command"])
    if engine == "vllm":
        assert "--tensor-parallel-size 8" in cmd and "--gpu-memory-utilization 0.92" in cmd
        assert "--decode-context-parallel-size" not in cmd
    else:
        assert "--tp 8 --dcp-size 8 --mem-fraction-static 0.92" in cmd
    assert "moonshotai/Kimi-K3" in c["command"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert c["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    # the Service reaches the pods: its selector matches their labels, its port the container's
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    assert svc["spec"]["ports"][0]["port"] == port
    assert dep["metadata"]["name"] == svc["metadata"]["name"] == f"{engine}-kimi-k3"
    assert dep["metadata"]["annotations"]["engine-advisor/dcp-size"] == str(dcp)


@pytest.mark.parametrize("ctx,engine,dcp,image,port", CASES)
def test_compose_service(capsys, tmp_path, ctx, engine, dcp, image, port):
    code, out, err = run(capsys, *SEED, "--context-tokens", str(ctx), "--emit", "compose",
                         "--deploy-name", "llm", "--shm-gib", "32",
                         "--image", f"registry.example:5000/mirror/{image}")
    assert code == 0, err
    data = yaml.safe_load(out)
    check = compose_check(tmp_path, data)
    assert check.returncode == 0, check.stdout + check.stderr
    rec, _ = expected(ctx)
    s = data["services"]["llm"]
    assert s["image"] == f"registry.example:5000/mirror/{image}:latest"
    assert s["entrypoint"] == [*rec.launch_command, "--host", "0.0.0.0", "--port", str(port)]
    assert s["ports"] == [f"{port}:{port}"]
    assert s["shm_size"] == "32gb"
    assert s["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 8, "capabilities": ["gpu"]}]
    assert s["healthcheck"]["test"][0] == "CMD"
    assert f"http://127.0.0.1:{port}/health" in s["healthcheck"]["test"][-1]


def test_validators_reject_broken_files(tmp_path):
    """The schema checks above can fail: a wrong type or an unknown field is caught."""
    rec, w = expected(204800)
    dep, _ = kubernetes(rec, w, DeployOptions())
    bad = copy.deepcopy(dep)
    bad["spec"]["replicas"] = "one"
    assert k8s_errors(bad)
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["gpus"] = 8
    assert k8s_errors(bad)
    data = compose(rec, w, DeployOptions(format="compose"))
    next(iter(data["services"].values()))["gpus_count"] = 8
    check = compose_check(tmp_path, data)
    assert check.returncode != 0 and "gpus_count" in check.stdout + check.stderr


def test_amd_gpus_and_unsupported_vendor(tmp_path):
    rec, w = expected(65536)
    amd = Workload.model_validate({**w.model_dump(exclude_none=True),
                                   "requirements": {"hardware_vendor": "amd"}})
    dep, _ = kubernetes(rec, amd, DeployOptions())
    assert k8s_errors(dep) == []
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "amd.com/gpu": 8}
    data = compose(rec, amd, DeployOptions(format="compose"))
    s = next(iter(data["services"].values()))
    assert s["devices"] == ["/dev/kfd", "/dev/dri"] and "deploy" not in s
    assert compose_check(tmp_path, data).returncode == 0
    mi300x = Workload.model_validate({**w.model_dump(exclude_none=True), "gpu": {
        "name": "MI300X", "memory_bytes": 192e9, "hbm_bandwidth": 5.3e12}})
    dep, _ = kubernetes(rec, mi300x, DeployOptions())
    assert "amd.com/gpu" in dep["spec"]["template"]["spec"]["containers"][0]["resources"][
        "limits"]
    tpu = Workload.model_validate({**w.model_dump(exclude_none=True),
                                   "requirements": {"hardware_vendor": "tpu"}})
    with pytest.raises(DeployError) as exc:
        kubernetes(rec, tpu, DeployOptions())
    assert exc.value.field == "requirements.hardware_vendor"


@pytest.mark.parametrize("args,message", [
    (["--emit", "yaml"], "--emit: Input should be 'k8s' or 'compose'"),
    (["--emit", "k8s", "--image-tag", "bad tag"], "--image-tag: String should match pattern"),
    (["--emit", "k8s", "--deploy-name", "Kimi_K3"], "--deploy-name: String should match"),
    (["--emit", "k8s", "--image", "ROCm/vLLM"], "--image: String should match pattern"),
    (["--emit", "compose", "--shm-gib", "0"], "--shm-gib: Input should be greater than 0"),
    (["--image-tag", "v1"], "--image-tag: only used with --emit"),
])
def test_bad_emit_options(capsys, args, message):
    code, out, err = run(capsys, *SEED, "--context-tokens", "65536", *args)
    assert code == 2 and out == ""
    assert err.startswith("engine-advisor: error: ") and message in err, err


def test_emit_and_json_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exc:
        main([*SEED, "--context-tokens", "65536", "--emit", "k8s", "--json"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
