"""POST /v1/deploy (in-process): the recommendation as Kubernetes / compose YAML."""

from __future__ import annotations

import pytest
import yaml
from svc_helpers import SEED, assert_error

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.presentation.deploy import DeployOptions, render
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload


@pytest.mark.parametrize("fmt", ["k8s", "compose"])
def test_deploy_is_the_rendered_recommendation(client, fmt):
    r = client.post("/v1/deploy", params={"format": fmt, "image_tag": "v0.11.0",
                                          "shm_gib": "32"}, json=SEED)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/yaml")
    assert r.headers["content-disposition"] == f'attachment; filename="sglang-{fmt}.yaml"'
    m = default_model()
    w = Workload.model_validate(SEED)
    opts = DeployOptions(format=fmt, image_tag="v0.11.0", shm_gib=32)
    assert r.text == render(recommend(m, w, m.version), w, opts)
    assert "&id" not in r.text  # plain YAML, no anchors / aliases
    docs = list(yaml.safe_load_all(r.text))
    if fmt == "k8s":
        assert [d["kind"] for d in docs] == ["Deployment", "Service"]
        pod = docs[0]["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"] == "lmsysorg/sglang:v0.11.0"
        assert pod["volumes"][0]["emptyDir"]["sizeLimit"] == "32Gi"
    else:
        assert docs[0]["services"]["sglang"]["shm_size"] == "32gb"


@pytest.mark.parametrize("params,param,contains", [
    ({"format": "helm"}, "format", "'k8s' or 'compose'"),
    ({"image_tag": "a b"}, "image_tag", "should match pattern"),
    ({"image": "https://hub/x"}, "image", "should match pattern"),
    ({"name": "Not_A_Label"}, "name", "should match pattern"),
    ({"shm_gib": "0"}, "shm_gib", "greater than 0"),
    ({"colour": "red"}, "colour", "Extra inputs are not permitted"),
])
def test_bad_options(client, params, param, contains):
    assert_error(client.post("/v1/deploy", params=params, json=SEED), 422, param=param,
                 contains=contains)


def test_bad_workload_and_vendor(client):
    assert_error(client.post("/v1/deploy", json={**SEED, "context_tokens": 0}), 422,
                 param="context_tokens")
    assert_error(client.post("/v1/deploy", json={**SEED,
                                                 "requirements": {"hardware_vendor": "tpu"}}),
                 422, param="requirements.hardware_vendor", contains="not tpu")


HYBRID = {"context_tokens": 200_000, "output_tokens": 1000, "batch_size": 8,
          "preset": "qwen3-next-80b-a3b-fp8", "gpu": "H200", "num_gpus": 1,
          "engines": ["sglang"]}
KNOBS = ["--disable-radix-cache", "--max-running-requests", "8"]


def test_the_memory_knob_advice_reaches_every_surface(client):
    """Few long sequences on a hybrid: SGLang's state pool sized to them is in the REST
    answer (the prediction's memory_flags, the launch command, a reason), the deployment
    files' container command and the CLI's launch line."""
    r = client.post("/v1/recommend", json=HYBRID)
    assert r.status_code == 200, r.text
    rec = r.json()
    (p,) = rec["predictions"]
    assert p["memory_flags"] == KNOBS and p["running_sequences"] == 8
    assert p["running_limit"] == "none" and p["state_slots"] == 8
    assert rec["launch_command"][-3:] == KNOBS
    assert any(x.startswith(" ".join(KNOBS)) for x in rec["reasons"])
    for fmt in ("k8s", "compose"):
        text = client.post("/v1/deploy", params={"format": fmt}, json=HYBRID).text
        doc = next(yaml.safe_load_all(text))
        cmd = (doc["spec"]["template"]["spec"]["containers"][0]["command"] if fmt == "k8s"
               else doc["services"]["sglang"]["entrypoint"])
        assert cmd[cmd.index("--disable-radix-cache"):][:3] == KNOBS, cmd
    import contextlib
    import io

    from engine_advisor.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["recommend", "--preset", HYBRID["preset"], "--gpu", "H200", "--num-gpus", "1",
              "--context-tokens", "200000", "--output-tokens", "1000", "--batch-size", "8",
              "--engines", "sglang"])
    assert "--mem-fraction-static 0.90 " + " ".join(KNOBS) in out.getvalue()
