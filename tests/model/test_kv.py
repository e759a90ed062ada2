import pytest

from model.kv import KvConfigError, from_hf_config, from_preset

LLAMA_LIKE = {"num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
              "hidden_size": 8192}
DEEPSEEK_V3 = {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
               "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "v_head_dim": 128}


def test_gqa_reference_value():
    layout = from_hf_config(LLAMA_LIKE, "fp16")
    assert layout.bytes_per_token == 262_144  # 2 x 64 x 8 x 128 x 2
    assert layout.attention == "gqa" and layout.kv_heads == 8


def test_explicit_head_dim_wins_over_hidden_size():
    cfg = {**LLAMA_LIKE, "head_dim": 64}
    assert from_hf_config(cfg, "bf16").bytes_per_token == 2 * 64 * 8 * 64 * 2


def test_mla_reference_values():
    assert from_hf_config(DEEPSEEK_V3, "bf16").bytes_per_token == 70_272
    assert from_hf_config(DEEPSEEK_V3, "fp8").bytes_per_token == 35_136
    assert from_hf_config(DEEPSEEK_V3, "bf16").attention == "mla"


def test_mla_is_not_computed_with_the_gqa_formula():
    # The GQA formula on this config would give ~4.8 MiB per token.
    assert from_hf_config(DEEPSEEK_V3, "bf16").bytes_per_token < 100_000


@pytest.mark.parametrize("name,expected", [("kimi-k2", 70_272), ("deepseek-v3", 70_272),
                                           ("kimi-k3", 70_272), ("llama-3.1-70b", 327_680),
                                           ("llama-3.1-8b", 131_072)])
def test_presets(name, expected):
    assert from_preset(name, "bf16").bytes_per_token == expected
    assert from_preset(name, "fp8").bytes_per_token == expected // 2


def test_hybrid_counts_only_full_attention_layers():
    types = ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"] * 12
    cfg = {"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 128, "layer_types": types, "sliding_window": 4096}
    assert from_hf_config(cfg, "bf16").bytes_per_token == 2 * 12 * 8 * 128 * 2


def test_multimodal_wrapper_uses_text_config():
    assert from_hf_config({"text_config": LLAMA_LIKE}, "fp16").bytes_per_token == 262_144


@pytest.mark.parametrize("cfg,field", [
    ({}, "hf_config.num_hidden_layers"),
    ({"num_hidden_layers": 0, "num_attention_heads": 8}, "hf_config.num_hidden_layers"),
    ({"num_hidden_layers": "many", "num_attention_heads": 8}, "hf_config.num_hidden_layers"),
    ({"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 3,
      "head_dim": 64}, "hf_config.num_key_value_heads"),
    ({"num_hidden_layers": 4, "num_attention_heads": 8}, "hf_config.hidden_size"),
    ({"num_hidden_layers": 4, "kv_lora_rank": 512}, "hf_config.qk_rope_head_dim"),
    ({"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 64,
      "layer_types": ["sliding_attention", "sliding_attention"]}, "hf_config.layer_types"),
    ([1, 2], "hf_config"),
])
def test_malformed_configs_name_the_field(cfg, field):
    with pytest.raises(KvConfigError) as exc:
        from_hf_config(cfg, "bf16")
    assert exc.value.field == field
    assert str(exc.value).startswith(field)


def test_unknown_preset():
    with pytest.raises(KvConfigError, match="preset: unknown preset 'gpt-9'"):
        from_preset("gpt-9", "bf16")
