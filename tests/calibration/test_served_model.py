"""The served model's architecture: presets, Hugging Face ids, config.json files, and the keys
rows record (engine_advisor.calibration.sweep.served_model, engine_advisor.model.arch.aliases)."""

from __future__ import annotations

import json
import re

import pytest

from engine_advisor.calibration.sweep.modeldir import write_model_dir
from engine_advisor.calibration.sweep.served_model import (
    MODEL_CONFIG,
    MODEL_CONFIGS,
    ServedModelError,
    config_key,
    resolve_row_config,
    resolve_served_model,
)
from engine_advisor.model.arch.aliases import ALIASES, preset_of_model_id
from engine_advisor.model.arch.presets import PRESETS, preset_config, preset_source


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_is_found_by_the_repository_of_its_source(name):
    repo = re.search(r"Hugging Face ([\w.-]+/[\w.-]+)", preset_source(name))[1]
    assert preset_of_model_id(repo) == name
    assert preset_of_model_id(repo.upper()) == name
    assert preset_of_model_id(name) == name
    assert preset_of_model_id(f"/models/{repo.split('/')[1]}/") == name
    assert repo.lower() in ALIASES


@pytest.mark.parametrize("model_id, preset", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
    ("meta-llama/Meta-Llama-3.1-8B", "llama-3.1-8b"),
    ("hf.co/deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite"),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507", "qwen3-235b-a22b"),
    ("m", None), ("", None), (None, None), ("meta-llama/Llama-3.1-8B-FP8", None),
])
def test_model_ids(model_id, preset):
    assert preset_of_model_id(model_id) == preset


def test_a_preset_gives_the_kv_bytes_at_the_dtype():
    s = resolve_served_model(preset_name="deepseek-v2-lite")
    assert (s.key, s.source, s.kv_bytes_per_token, s.kv_cache_dtype) == (
        "deepseek-v2-lite", "preset", 31104, "bf16")
    assert resolve_served_model(preset_name="deepseek-v2-lite",
                                kv_cache_dtype="fp8").kv_bytes_per_token == 15552
    # the bytes given tell the dtype
    assert resolve_served_model(preset_name="deepseek-v2-lite",
                                kv_bytes_per_token=15552).kv_cache_dtype == "fp8"
    # GQA heads split over the TP ranks; MLA's latent is not
    assert resolve_served_model(preset_name="llama-3.1-70b", num_gpus=8).kv_shards == 8
    assert resolve_served_model(preset_name="deepseek-v3", num_gpus=8).kv_shards == 1


def test_kv_bytes_that_disagree_with_a_named_architecture_are_an_error():
    with pytest.raises(ServedModelError, match=r"--kv-bytes-per-token: 70272 disagrees with "
                                               r"--preset deepseek-v2-lite, whose architecture "
                                               r"stores 31104 B/token at bf16 \(31104 at bf16, "
                                               r"15552 at fp8\)"):
        resolve_served_model(preset_name="deepseek-v2-lite", kv_bytes_per_token=70272)
    with pytest.raises(ServedModelError, match="at fp8"):
        resolve_served_model(preset_name="deepseek-v2-lite", kv_bytes_per_token=31104,
                             kv_cache_dtype="fp8")
    with pytest.raises(ServedModelError, match=r"--kv-shards: 1 disagrees .* split over 8 of 8"):
        resolve_served_model(preset_name="llama-3.1-70b", kv_shards=1, num_gpus=8)
    with pytest.raises(ServedModelError, match="--preset: unknown preset 'nope'"):
        resolve_served_model(preset_name="nope")


def test_a_model_id_names_the_architecture_unless_the_kv_bytes_say_otherwise():
    s = resolve_served_model(model_id="deepseek-ai/DeepSeek-V2-Lite")
    assert (s.key, s.source, s.kv_bytes_per_token) == ("deepseek-v2-lite", "model-id", 31104)
    # a coincidental name: the flag's bytes win, the rows name no architecture, and say why
    s = resolve_served_model(model_id="kimi-k3", kv_bytes_per_token=70272)
    assert (s.key, s.source, s.kv_bytes_per_token) == ("", "kv-only", 70272)
    assert "70272 disagrees with the served model 'kimi-k3'" in s.note
    assert resolve_served_model(model_id="m", kv_bytes_per_token=1000).key == ""
    with pytest.raises(ServedModelError, match=r"--kv-bytes-per-token: required: the served "
                                               r"model 'm' names no known architecture"):
        resolve_served_model(model_id="m")


def test_a_config_of_a_preset_served_from_a_model_folder_is_that_preset(tmp_path):
    folder = write_model_dir(preset_config("llama-3.1-8b"), tmp_path / "m", max_model_len=200_000)
    config = json.loads((folder / "config.json").read_text())
    assert config["max_position_embeddings"] == 200_000
    assert config_key(config) == "llama-3.1-8b"
    s = resolve_served_model(hf_config=config)
    assert (s.key, s.source, s.config) == ("llama-3.1-8b", "hf-config", None)


def test_another_config_gets_a_stable_key_and_is_found_again(tmp_path):
    config = {**preset_config("llama-3.1-8b"), "num_hidden_layers": 16,
              "_name_or_path": "acme/Llama-Half"}
    s = resolve_served_model(hf_config=config, kv_bytes_per_token=65536)
    assert re.fullmatch(r"hf:Llama-Half@[0-9a-f]{16}", s.key) and s.config == config
    assert s.kv_bytes_per_token == 65536 and s.kv_cache_dtype == "bf16"
    assert config_key({**config, "max_position_embeddings": 4096}) == s.key   # physics only
    assert config_key({**config, "num_hidden_layers": 15}) != s.key

    run = tmp_path / "run"
    run.mkdir()
    (run / "dataset.csv").write_text("")
    (run / MODEL_CONFIG).write_text(json.dumps(config))
    assert resolve_row_config(run / "dataset.csv", s.key) == config
    assert resolve_row_config(run, s.key) == config
    # beside a combined CSV
    combined = tmp_path / "all.csv"
    (tmp_path / MODEL_CONFIGS).mkdir()
    (tmp_path / MODEL_CONFIGS / f"{s.physics_hash}.json").write_text(json.dumps(config))
    assert resolve_row_config(combined, s.key) == config
    # presets and plain names
    assert resolve_row_config(combined, "deepseek-v2-lite") == preset_config("deepseek-v2-lite")
    assert resolve_row_config(combined, "") is None
    assert resolve_row_config(combined, "my-served-name") is None
    # a stored config that is no longer the one the key names
    (run / MODEL_CONFIG).write_text(json.dumps({**config, "num_hidden_layers": 15}))
    with pytest.raises(ServedModelError, match=r"no stored config.json with architecture hash "
                                               r"[0-9a-f]{16} in .*model-config.json"):
        resolve_row_config(run, s.key)


def test_a_config_that_is_no_architecture_names_its_field():
    with pytest.raises(ServedModelError, match=r"--hf-config: hf_config.hidden_size: missing"):
        resolve_served_model(hf_config={"num_hidden_layers": 2, "vocab_size": 10})
