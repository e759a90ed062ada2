"""``engine-advisor recommend --engines trtllm --emit k8s|compose``: the TensorRT-LLM command with
its free-memory fraction, and its ``--config`` YAML as a ConfigMap mounted at the path the
command names (Kubernetes) or a compose ``configs`` entry, validated against the real schemas
(test_emit.py's checks)."""

from __future__ import annotations

import yaml
from test_emit import compose_check, k8s_errors, run

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload

ARGS = ["recommend", "--preset", "llama-3.1-70b", "--gpu", "H200", "--context-tokens", "8192",
        "--output-tokens", "512", "--batch-size", "16", "--engines", "trtllm",
        "--model-name", "meta-llama/Llama-3.1-70B"]
PATH = "/etc/trtllm/extra-llm-api-config.yml"


def expected():
    w = Workload(context_tokens=8192, output_tokens=512, batch_size=16, preset="llama-3.1-70b",
                 gpu="H200", engines=["trtllm"], model="meta-llama/Llama-3.1-70B")
    m = default_model()
    return recommend(m, w, m.version)


def test_k8s_carries_the_command_and_mounts_the_config(capsys):
    code, out, err = run(capsys, *ARGS, "--emit", "k8s", "--image-tag", "1.2.0")
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Deployment", "Service"]
    for d in docs:
        assert k8s_errors(d) == []
    rec = expected()
    cm, dep, _ = docs
    assert cm["data"] == {"config.yml": rec.config_file.content}
    config = yaml.safe_load(cm["data"]["config.yml"])
    assert config["kv_cache_config"]["free_gpu_memory_fraction"] == rec.mem_flag_value
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "nvcr.io/nvidia/tensorrt-llm/release:1.2.0"
    assert c["command"] == [*rec.launch_command, "--host", "0.0.0.0", "--port", "8000"]
    assert " ".join(c["command"]).startswith(
        "trtllm-serve meta-llama/Llama-3.1-70B --tp_size 8 --kv_cache_free_gpu_memory_fraction "
        f"{rec.mem_flag_value:.2f}")
    assert c["command"][c["command"].index("--config") + 1] == PATH
    assert {"name": "engine-config", "mountPath": PATH, "subPath": "config.yml",
            "readOnly": True} in c["volumeMounts"]
    assert {"name": "engine-config", "configMap": {"name": cm["metadata"]["name"]}} in (
        pod["volumes"])
    ann = dep["metadata"]["annotations"]
    assert ann["engine-advisor/mem-fraction"] == f"{rec.mem_fraction:.2f}"
    assert ann["engine-advisor/mem-flag-value"] == f"{rec.mem_flag_value:.2f}"


def test_compose_carries_the_command_and_the_config(capsys, tmp_path):
    code, out, err = run(capsys, *ARGS, "--emit", "compose", "--deploy-name", "llm")
    assert code == 0, err
    data = yaml.safe_load(out)
    check = compose_check(tmp_path, data)
    assert check.returncode == 0, check.stdout + check.stderr
    rec = expected()
    s = data["services"]["llm"]
    assert s["entrypoint"] == [*rec.launch_command, "--host", "0.0.0.0", "--port", "8000"]
    assert s["configs"] == [{"source": "llm-config", "target": PATH}]
    assert data["configs"] == {"llm-config": {"content": rec.config_file.content}}


def test_vllm_files_have_no_config(capsys):
    code, out, err = run(capsys, *ARGS[:-4], "--emit", "k8s")
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    assert "engine-config" not in out


def test_the_table_prints_the_flag_and_the_config(capsys):
    code, out, err = run(capsys, *ARGS)
    assert code == 0, err
    rec = expected()
    assert (f"--kv_cache_free_gpu_memory_fraction {rec.mem_flag_value:.2f} (= "
            f"{rec.mem_fraction:.2f} of the GPU)") in out
    assert f"{PATH}:\n  kv_cache_config:\n    free_gpu_memory_fraction: " in out
    assert "calibrated: false" in out
