"""POST /v1/deploy (in-process): the recommendation as Kubernetes / compose YAML."""

from __future__ import annotations

import pytest
import yaml
from svc_helpers import SEED, assert_error

from model.fit.default import default_model
from model.presentation.deploy import DeployOptions, render
from model.recommend import recommend
from model.workload import Workload


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
