import math

import pytest
from pydantic import ValidationError

from engine_advisor.model.hardware.gpus import GpuSpec
from engine_advisor.model.workload import Workload

BASE = {"context_tokens": 65536, "output_tokens": 2048, "batch_size": 64,
        "kv_bytes_per_token": 70272, "gpu": "B300", "num_gpus": 8}

BAD = [
    ("zero context", {"context_tokens": 0}, "context_tokens", "greater than 0"),
    ("negative output", {"output_tokens": -5}, "output_tokens", "greater than 0"),
    ("zero batch", {"batch_size": 0}, "batch_size", "greater than 0"),
    ("zero gpus", {"num_gpus": 0}, "num_gpus", "greater than 0"),
    ("dcp not dividing", {"dcp_sizes": [3]}, "dcp_sizes", "do not divide num_gpus 8"),
    ("unknown gpu", {"gpu": "A100X"}, "gpu", "unknown GPU 'A100X'"),
    ("unknown preset", {"kv_bytes_per_token": None, "preset": "gpt-9"}, "preset",
     "unknown preset 'gpt-9'"),
    ("malformed config", {"kv_bytes_per_token": None, "hf_config": {"num_hidden_layers": "x"}},
     "hf_config.num_hidden_layers", "must be an integer"),
    ("nan context", {"context_tokens": math.nan}, "context_tokens", "finite number"),
    ("inf batch", {"batch_size": math.inf}, "batch_size", "finite number"),
    ("absurd context", {"context_tokens": 10**12}, "context_tokens", "less than or equal"),
    ("absurd kv", {"kv_bytes_per_token": 10**12}, "kv_bytes_per_token", "less than or equal"),
    ("no kv source", {"kv_bytes_per_token": None}, "kv_bytes_per_token",
     "exactly one of kv_bytes_per_token, hf_config or preset"),
    ("two kv sources", {"preset": "kimi-k2"}, "kv_bytes_per_token",
     "got kv_bytes_per_token, preset"),
    ("bad dtype", {"kv_cache_dtype": "int3"}, "kv_cache_dtype", "'bf16', 'fp16' or 'fp8'"),
    ("unknown engine", {"engines": ["lmdeploy"]}, "engines",
     "'vllm', 'sglang' or 'trtllm'"),
    ("string context", {"context_tokens": "lots"}, "context_tokens", "valid integer"),
    ("fractional context", {"context_tokens": 1.5}, "context_tokens", "fractional part"),
    ("custom gpu negative bandwidth", {"gpu": {"name": "X1", "memory_bytes": 8e10,
                                               "hbm_bandwidth": -1}}, "hbm_bandwidth",
     "greater than"),
    ("unknown field", {"contxt_tokens": 5}, "contxt_tokens", "Extra inputs are not permitted"),
]


@pytest.mark.parametrize("label,change,field,message", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_name_the_field(label, change, field, message):
    data = {**BASE, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ValidationError) as exc:
        Workload.model_validate(data)
    text = str(exc.value)
    assert field in text, text
    assert message in text, text


def test_custom_gpu_spec_is_accepted():
    w = Workload.model_validate({**BASE, "gpu": {"name": "X1", "memory_bytes": 96e9,
                                                 "hbm_bandwidth": 4e12}})
    assert w.gpu_spec() == GpuSpec(name="X1", memory_bytes=96e9, hbm_bandwidth=4e12)


def test_gpu_names_are_case_insensitive():
    assert Workload.model_validate({**BASE, "gpu": "h200"}).gpu_spec().name == "H200"


def test_weight_bytes_from_preset_and_override():
    w = Workload.model_validate({**BASE, "kv_bytes_per_token": None, "preset": "kimi-k2"} |
                                {"kv_bytes_per_token": None})
    shape = w.model_shape()
    assert shape.weights_known and shape.weight_bytes == pytest.approx(1.03e12, rel=0.05)
    assert shape.key.startswith("kimi-k2@")
    bare = Workload.model_validate(BASE).model_shape()
    assert not bare.weights_known and bare.weight_bytes == 0
    w2 = Workload.model_validate({**BASE, "model_weight_bytes": 5e11})
    assert w2.model_shape().weight_bytes == 5e11 and w2.model_shape().weights_known


def test_hf_config_and_preset_give_the_same_physics():
    import json

    from engine_advisor.model.arch.presets import PRESET_DIR
    cfg = json.loads((PRESET_DIR / "llama-3.1-8b.json").read_text())
    cfg.pop("_source", None)
    a = Workload.model_validate({**BASE, "kv_bytes_per_token": None, "hf_config": cfg,
                                 "model": "llama-3.1-8b"}).model_shape()
    b = Workload.model_validate({**BASE, "kv_bytes_per_token": None,
                                 "preset": "llama-3.1-8b"}).model_shape()
    assert a.kv_bytes_per_token == b.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert a.weight_bytes == pytest.approx(b.weight_bytes)
    assert a.matmul_flops == b.matmul_flops
