"""The REST contract with TensorRT-LLM (in-process): /v1/recommend ranks it beside vLLM and
SGLang when named, its answers say calibrated: false with a reason, its launch command carries
the free-memory fraction and the --config file, /v1/deploy mounts that file, and bad input
names the field."""

from __future__ import annotations

import yaml
from svc_helpers import SEED, assert_error

LLAMA = {"context_tokens": 8192, "output_tokens": 512, "batch_size": 16,
         "preset": "llama-3.1-70b", "gpu": "H200", "num_gpus": 8}


def test_recommend_ranks_trtllm_beside_vllm_and_sglang(client):
    r = client.post("/v1/recommend", json={**LLAMA, "engines": ["vllm", "sglang", "trtllm"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert {p["engine"] for p in body["predictions"]} == {"vllm", "sglang", "trtllm"}
    for p in body["predictions"]:
        if p["engine"] == "trtllm":
            assert p["calibrated"] is False and "physics priors" in p["calibration_note"]
    assert any(x.startswith("trtllm calibrated: false") for x in body["reasons"])


def test_recommend_trtllm_alone_gives_its_command_and_config(client):
    r = client.post("/v1/recommend", json={**LLAMA, "engines": ["trtllm"],
                                           "model": "meta-llama/Llama-3.1-70B"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["engine"] == "trtllm" and body["confidence"] == "prior"
    assert body["mem_fraction_flag"] == "--kv_cache_free_gpu_memory_fraction"
    value = body["mem_flag_value"]
    assert 0 < value < body["mem_fraction"]
    cmd = body["launch_command"]
    assert cmd[:2] == ["trtllm-serve", "meta-llama/Llama-3.1-70B"]
    assert cmd[cmd.index("--kv_cache_free_gpu_memory_fraction") + 1] == f"{value:.2f}"
    assert cmd[cmd.index("--config") + 1] == body["config_file"]["path"]
    kv = yaml.safe_load(body["config_file"]["content"])["kv_cache_config"]
    assert kv["free_gpu_memory_fraction"] == value and kv["tokens_per_block"] == 32


def test_the_default_engines_are_vllm_and_sglang(client):
    r = client.post("/v1/recommend", json=SEED)
    assert r.status_code == 200, r.text
    assert {p["engine"] for p in r.json()["predictions"]} == {"vllm", "sglang"}
    assert r.json()["config_file"] is None


def test_predict_trtllm_says_why_it_is_uncalibrated(client):
    r = client.post("/v1/predict", json={"workload": SEED, "engine": "trtllm", "dcp_size": 8})
    assert r.status_code == 200, r.text
    p = r.json()["prediction"]
    assert p["engine"] == "trtllm" and p["calibrated"] is False
    assert "cannot be installed here" in p["calibration_note"]


def test_deploy_trtllm_mounts_its_config(client):
    r = client.post("/v1/deploy", params={"format": "k8s"}, json={**LLAMA, "engines": ["trtllm"]})
    assert r.status_code == 200, r.text
    kinds = [d["kind"] for d in yaml.safe_load_all(r.text)]
    assert kinds == ["ConfigMap", "Deployment", "Service"]


def test_a_requirement_trtllm_lacks_is_named(client):
    r = client.post("/v1/recommend", json={**LLAMA, "engines": ["trtllm"],
                                           "requirements": {"hardware_vendor": "amd"}})
    assert_error(r, 422, param="requirements", contains="trtllm does not run on amd")
    r = client.post("/v1/recommend", json={**LLAMA, "engines": ["trtllm", "tensorrt"]})
    assert_error(r, 422, param="engines.1", contains="trtllm")
