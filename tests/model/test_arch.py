"""engine_advisor.model.arch against hand-computed numbers: one test per preset, hybrid / sliding /
quantized configs, and bad configs that must name the culprit field."""

import copy
import json
import math

import numpy as np
import pytest

from engine_advisor.model.arch import (
    PRESETS,
    ArchConfigError,
    Architecture,
    from_hf_config,
    preset,
    preset_config,
    preset_source,
)

GB = 1e9


# ---- presets -------------------------------------------------------------------------------

def test_every_preset_cites_its_source_and_loads():
    assert set(PRESETS) == {"kimi-k3", "kimi-k2", "deepseek-v3", "deepseek-v2-lite",
                            "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
                            "qwen3-235b-a22b", "qwen3-32b", "qwen3-30b-a3b", "mixtral-8x7b",
                            "qwen3-next-80b-a3b-fp8", "nemotron-3-nano-30b-a3b"}
    for name in PRESETS:
        assert "config.json" in preset_source(name)
        arch = preset(name)
        assert isinstance(arch, Architecture) and arch.name == name
        json.dumps(arch.to_dict())                       # JSON-able


def test_llama_3_1_8b():
    a = preset("llama-3.1-8b")
    assert (a.attention, a.q_heads, a.kv_heads, a.head_dim) == ("gqa", 32, 8, 128)
    assert a.kv_bytes_per_token("bf16") == 2 * 32 * 8 * 128 * 2 == 131_072
    assert a.kv_bytes_per_token("fp8") == 65_536
    assert a.kv_bytes_per_layer_token("bf16") == 2 * 8 * 128 * 2
    embed = 128_256 * 4096                                               # 525,336,576
    layer = (4096 * 4096 * 2 + 4096 * 1024 * 2) + 3 * 4096 * 14_336 + 2 * 4096  # 218,112,000
    assert a.total_params == 2 * embed + 32 * layer + 4096 == 8_030_261_248  # "8.03B"
    assert a.weight_bytes == 2 * a.total_params                          # bf16
    assert a.active_params_per_token == a.total_params - embed - (32 * 2 * 4096 + 4096)
    assert a.matmul_flops_per_token == 2 * a.active_params_per_token
    assert a.dense_weight_bytes_per_token_step == a.weight_bytes - 2 * embed
    assert a.n_moe_layers == 0 and a.routed_expert_bytes == 0
    np.testing.assert_array_equal(a.decode_weight_bytes([1, 64]),
                                  [a.dense_weight_bytes_per_token_step] * 2)
    assert a.attn_decode_flops_per_ctx_token == 32 * (2 * 128 * 2) * 32 == 524_288
    # causal prefill of 1000 tokens: 32 layers x 2 x 32 heads x (128 + 128) x 1000 x 1001 / 2
    assert a.attn_prefill_flops(1000) == pytest.approx(32 * 2 * 32 * 256 * 500_500)
    assert a.state_bytes_per_seq("bf16") == 0


def test_llama_3_1_70b():
    a = preset("llama-3.1-70b")
    assert a.kv_bytes_per_token("bf16") == 2 * 80 * 8 * 128 * 2 == 327_680
    layer = (8192 * 8192 * 2 + 8192 * 1024 * 2) + 3 * 8192 * 28_672 + 2 * 8192
    assert a.total_params == 2 * 128_256 * 8192 + 80 * layer + 8192 == 70_553_706_496  # "70.6B"
    assert a.weight_bytes == pytest.approx(141.1 * GB, rel=1e-3)


def test_llama_3_1_405b():
    a = preset("llama-3.1-405b")
    assert a.kv_bytes_per_token("bf16") == 2 * 126 * 8 * 128 * 2 == 516_096
    layer = (16_384 * 16_384 * 2 + 16_384 * 1024 * 2) + 3 * 16_384 * 53_248 + 2 * 16_384
    assert a.total_params == 2 * 128_256 * 16_384 + 126 * layer + 16_384 == 405_853_388_800


def test_qwen3_32b():
    a = preset("qwen3-32b")
    assert a.n_sliding_layers == 0 and a.sliding_window is None    # use_sliding_window: false
    assert a.kv_bytes_per_token("bf16") == 2 * 64 * 8 * 128 * 2 == 262_144
    # q 64x128, k/v 8x128 on hidden 5120, per-head q/k norms (2 x 128), MLP 25,600
    layer = (8192 * 5120 * 2 + 1024 * 5120 * 2 + 256) + 3 * 5120 * 25_600 + 2 * 5120
    assert a.total_params == 2 * 151_936 * 5120 + 64 * layer + 5120 == 32_762_123_264  # "32.8B"


def test_qwen3_235b_a22b():
    a = preset("qwen3-235b-a22b")
    assert a.kv_bytes_per_token("bf16") == 2 * 94 * 4 * 128 * 2 == 192_512
    assert (a.n_moe_layers, a.n_dense_mlp_layers, a.n_routed_experts, a.experts_per_token,
            a.n_shared_experts, a.expert_intermediate) == (94, 0, 128, 8, 0, 1536)
    expert = 3 * 4096 * 1536                                          # 18,874,368
    assert a.routed_expert_params == expert and a.routed_expert_bytes == 2 * expert
    attn = 8192 * 4096 * 2 + 512 * 4096 * 2                          # 71,303,168
    router = 128 * 4096
    layer = attn + 256 + router + 128 * expert + 2 * 4096
    assert a.total_params == 2 * 151_936 * 4096 + 94 * layer + 4096 == 235_093_634_560
    # "A22B": 8 of 128 experts per token
    assert a.active_params_per_token == 94 * (attn + router + 8 * expert) + 151_936 * 4096
    assert a.active_params_per_token == pytest.approx(21.57e9, rel=1e-3)
    # one token touches its 8 experts; 16 tokens 128 (1 - (120/128)^16) in expectation
    np.testing.assert_allclose(a.expected_experts_touched([1, 16]),
                               [8, 128 * (1 - (120 / 128) ** 16)])
    np.testing.assert_allclose(a.decode_weight_bytes(1), a.dense_weight_bytes_per_token_step
                               + 94 * 8 * 2 * expert)


def test_deepseek_v3_fp8_blocks():
    a = preset("deepseek-v3")
    assert a.attention == "mla" and a.kv_heads == 1 and a.head_dim == 128 + 64
    assert a.kv_bytes_per_token("bf16") == 61 * (512 + 64) * 2 == 70_272
    assert a.kv_bytes_per_token("fp8") == 35_136
    assert (a.n_dense_mlp_layers, a.n_moe_layers) == (3, 58)           # first_k_dense_replace 3
    mla = (1536 * 7168 + 1536 + 24_576 * 1536 + 576 * 7168 + 512 + 32_768 * 512
           + 7168 * 16_384)                                             # 187,107,328
    moe = 256 * 7168 + 256 + 257 * 3 * 7168 * 2048                      # router, bias, 256+1 MLPs
    total = (2 * 129_280 * 7168 + 61 * (mla + 2 * 7168) + 3 * 3 * 7168 * 18_432 + 58 * moe
             + 7168)
    assert a.total_params == total == 671_026_419_200                   # "671B"
    # one expert: 3 x 2048 x 7168 fp8 bytes + one fp32 scale per 128 x 128 block
    # (16 x 56 blocks in each of the three matrices)
    assert a.routed_expert_bytes == 3 * 2048 * 7168 + 3 * 16 * 56 * 4 == 44_050_944
    # weights: fp8 linears (1 B + 4 B per 16,384) except embedding, lm_head, routers, norms
    bf16 = 2 * 129_280 * 7168 + 58 * 256 * 7168 + 61 * (2048 + 2 * 7168) + 7168
    fp8 = total - bf16 - 58 * 256
    assert a.weight_bytes == pytest.approx(fp8 * (1 + 4 / 16_384) + 2 * bf16 + 58 * 256 * 4,
                                           rel=1e-4)
    assert a.weight_bytes == pytest.approx(673.2 * GB, rel=1e-3)
    assert a.weight_dtype.startswith("fp8 block 128x128")
    assert a.active_params_per_token == pytest.approx(37e9, rel=0.02)   # "37B activated"
    # absorbed MLA decode: 128 heads x (2 x 576 + 2 x 512) x 61 layers
    assert a.attn_decode_flops_per_ctx_token == 128 * 2176 * 61
    # unabsorbed MLA prefill: 2 x 128 heads x (192 + 128) per pair and layer
    assert a.attn_prefill_flops(100) == pytest.approx(61 * 2 * 128 * 320 * 100 * 101 / 2)


def test_kimi_k2():
    a = preset("kimi-k2")
    assert a.kv_bytes_per_token("bf16") == 61 * 576 * 2 == 70_272
    assert (a.q_heads, a.n_routed_experts, a.experts_per_token, a.n_dense_mlp_layers) == \
        (64, 384, 8, 1)
    assert a.total_params == pytest.approx(1.026e12, rel=1e-3)          # "1T total"
    assert a.active_params_per_token == pytest.approx(32e9, rel=0.02)   # "32B activated"


def test_deepseek_v2_lite():
    a = preset("deepseek-v2-lite")
    assert a.q_lora_rank is None                                        # full q_proj
    assert a.kv_bytes_per_token("bf16") == 27 * 576 * 2 == 31_104
    assert (a.n_routed_experts, a.experts_per_token, a.n_shared_experts) == (64, 6, 2)
    assert a.shared_intermediate == 2 * 1408
    assert a.total_params == pytest.approx(15.7e9, rel=2e-3)            # "15.7B total"
    assert a.active_params_per_token == pytest.approx(2.4e9, rel=0.03)  # "2.4B activated"


def test_kimi_k3_hybrid_latent_moe_mxfp4():
    a = preset("kimi-k3")
    # 93 layers: 24 MLA (1-based ids 4, 8, ..., 92, 93), 69 KDA linear-attention layers
    assert (a.n_layers, a.n_full_attn_layers, a.n_linear_layers) == (93, 24, 69)
    assert a.kv_bytes_per_token("bf16") == 24 * 576 * 2 == 27_648
    assert a.kv_bytes_per_token("fp8") == 13_824
    # per KDA layer and sequence: 96 heads x 128 x 128 fp32 state + 3 conv windows of
    # (4 - 1) x 96 x 128 bf16
    assert a.state_bytes_per_seq("bf16") == 69 * (96 * 128 * 128 * 4 + 3 * 3 * 96 * 128 * 2)
    assert a.state_bytes_per_seq("bf16") == 449_372_160
    # LatentMoE: routed experts run at routed_expert_hidden_size 3584 with
    # moe_intermediate_size 3072; shared experts (2 x 3072) at the hidden size 7168
    assert (a.expert_hidden, a.expert_intermediate, a.shared_intermediate) == (3584, 3072, 6144)
    assert (a.n_routed_experts, a.experts_per_token, a.n_moe_layers) == (896, 16, 92)
    expert = 3 * 3584 * 3072                                            # 33,030,144
    assert a.routed_expert_params == expert
    # MXFP4: half a byte per weight + one E8M0 scale byte per 32 weights
    assert a.routed_expert_bytes == expert / 2 + expert / 32 == 17_547_264
    assert a.part_dtypes == tuple(sorted(
        {"embed": "bf16", "lm_head": "bf16", "attention": "bf16", "linear_attention": "bf16",
         "dense_mlp": "bf16", "shared_experts": "bf16", "routed_experts": "mxfp4 g32",
         "other": "bf16"}.items()))
    mla = (1536 * 7168 + 18_432 * 1536 + 576 * 7168 + 24_576 * 512 + 7168 * 12_288
           + 12_288 * 7168)                                            # incl. output gate
    kda = 4 * 12_288 * 7168 + 96 * 7168 + 128 * 7168 + 12_288 * 128 + 7168 * 12_288
    moe = 896 * 7168 + 2 * 7168 * 3584 + 3 * 7168 * 6144 + 16 * expert
    active = 24 * mla + 69 * kda + 3 * 7168 * 33_792 + 92 * moe + 163_840 * 7168
    assert a.active_params_per_token == active == 104_174_092_288
    assert a.total_params == pytest.approx(2.78e12, rel=2e-3)          # "2.8T"
    assert a.weight_bytes == pytest.approx(1560 * GB, rel=1e-3)
    assert a.weight_bytes / 8 < 288e9                                   # fits 8 x B300
    assert a.attn_decode_flops_per_ctx_token == 96 * 2176 * 24


def test_preset_and_its_config_give_the_same_hash():
    cfg = preset_config("kimi-k3")
    assert from_hf_config(cfg, name="x").arch_hash == preset("kimi-k3").arch_hash
    assert preset("kimi-k3").arch_hash != preset("kimi-k2").arch_hash
    changed = copy.deepcopy(cfg)
    changed["text_config"]["num_experts_per_token"] = 8
    assert from_hf_config(changed).arch_hash != preset("kimi-k3").arch_hash
    assert len({preset(n).arch_hash for n in PRESETS}) == len(PRESETS)
    # equal architectures are equal and hash alike (usable as cache keys)
    assert preset("kimi-k3") == preset("kimi-k3")
    assert {preset("kimi-k3"): 1}[preset("kimi-k3")] == 1


# ---- synthetic configs ---------------------------------------------------------------------

TINY = {"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000,
        "torch_dtype": "bfloat16"}


def tiny_linear_params(h=256, inter=512, heads=4, kv=2, hd=64):
    return {"q": heads * hd * h, "kv": 2 * kv * hd * h, "o": h * heads * hd,
            "mlp": 3 * h * inter}


def test_sliding_window_layer_types():
    cfg = {**TINY, "layer_types": ["sliding_attention", "full_attention"] * 2,
           "sliding_window": 100}
    a = from_hf_config(cfg)
    assert (a.n_full_attn_layers, a.n_sliding_layers, a.sliding_window) == (2, 2, 100)
    per_layer = 2 * 2 * 64 * 2                                          # K and V, 2 heads x 64
    assert a.kv_bytes_per_token("bf16") == 2 * per_layer
    assert a.sliding_kv_bytes_per_token("bf16") == 2 * per_layer
    np.testing.assert_array_equal(a.sliding_kv_bytes_per_seq([50, 5000], "bf16"),
                                  [50 * 2 * per_layer, 100 * 2 * per_layer])
    assert a.state_bytes_per_seq("bf16") == 100 * 2 * per_layer
    # prefill of 300 tokens: full layers 300 x 301 / 2 pairs, sliding layers
    # 100 x 101 / 2 + 200 x 100 pairs; 2 x 4 heads x (64 + 64) FLOPs per pair
    pairs = 2 * 300 * 301 / 2 + 2 * (100 * 101 / 2 + 200 * 100)
    assert a.attn_prefill_flops(300) == pytest.approx(2 * 4 * 128 * pairs)


def test_qwen2_style_sliding_from_max_window_layers():
    cfg = {**TINY, "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 3}
    assert from_hf_config(cfg).n_sliding_layers == 1
    assert from_hf_config({**cfg, "use_sliding_window": False}).n_sliding_layers == 0
    mistral = {**TINY, "sliding_window": 64}
    assert from_hf_config(mistral).n_sliding_layers == 4


def test_prefix_reuse_suffix_flops():
    a = preset("llama-3.1-8b")
    per_pair = 32 * 2 * 32 * 256
    # 1000 tokens with 600 cached: the 400 new ones see 601..1000 tokens
    expected = per_pair * (1000 * 1001 / 2 - 600 * 601 / 2)
    assert a.attn_prefill_flops_suffix(1000, 600) == pytest.approx(expected)
    out = a.attn_prefill_flops_suffix(np.array([1000, 1000]), np.array([0, 1000]))
    np.testing.assert_allclose(out, [a.attn_prefill_flops(1000), 0.0])
    # causal attention over the uncached part scales as 1 - s^2
    s = 0.6
    assert a.attn_prefill_flops_suffix(10_000, 6000) / a.attn_prefill_flops(10_000) == \
        pytest.approx(1 - s ** 2, rel=1e-3)


def test_text_config_and_tied_embeddings():
    a = from_hf_config({"text_config": TINY, "tie_word_embeddings": True})
    p = tiny_linear_params()
    layer = p["q"] + p["kv"] + p["o"] + p["mlp"] + 2 * 256
    assert a.tie_word_embeddings
    assert a.total_params == 1000 * 256 + 4 * layer + 256               # one table
    assert a.weight_bytes_by_part["lm_head"] == 0
    # the tied table is read by the lm_head every step and its matmul counts as active
    assert a.dense_weight_bytes_per_token_step == a.weight_bytes
    assert a.active_params_per_token == 4 * (layer - 512) + 1000 * 256


def test_fp32_checkpoint_and_dtype_key():
    a = from_hf_config({**TINY, "torch_dtype": None, "dtype": "float32"})
    assert a.weight_bytes == 4 * a.total_params and a.weight_dtype == "float32"


def test_compressed_tensors_nvfp4_with_ignore_list():
    quant = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
             "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                 "num_bits": 4, "type": "float", "strategy": "tensor_group",
                 "group_size": 16}}},
             "ignore": ["lm_head", "re:.*self_attn.*"]}
    a = from_hf_config({**TINY, "quantization_config": quant})
    p = tiny_linear_params()
    # MLP: 0.5 B per weight + one fp8 scale per 16 + one fp32 global scale per matrix
    mlp = p["mlp"] * (0.5 + 1 / 16) + 3 * 4
    assert a.weight_bytes_by_part["dense_mlp"] == 4 * mlp
    assert a.weight_bytes_by_part["attention"] == 4 * 2 * (p["q"] + p["kv"] + p["o"])
    assert a.weight_bytes_by_part["lm_head"] == 2 * 1000 * 256
    assert a.part_dtypes == tuple(sorted(
        {"embed": "bf16", "lm_head": "bf16", "attention": "bf16", "dense_mlp": "nvfp4 g16",
         "other": "bf16"}.items()))


def test_modelopt_excludes_by_layer_with_wrapper_prefix():
    quant = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
             "exclude_modules": ["language_model.lm_head", "language_model.model.layers.0*"]}
    a = from_hf_config({**TINY, "quantization_config": quant})
    p = tiny_linear_params()
    mlp_fp4 = p["mlp"] * (0.5 + 1 / 16) + 3 * 4
    assert a.weight_bytes_by_part["dense_mlp"] == 2 * p["mlp"] + 3 * mlp_fp4  # layer 0 bf16
    hf_quant_form = {**TINY, "quantization_config": {"quantization": {
        "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}}}
    assert from_hf_config(hf_quant_form).weight_bytes_by_part["dense_mlp"] == 4 * mlp_fp4


def test_awq_int4_groups():
    quant = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    a = from_hf_config({**TINY, "quantization_config": quant})
    # per matrix: 0.5 B per weight + per group of 128 inputs a 2-byte scale and a 4-bit zero
    gate_up = 512 * 256 * 0.5 + 512 * math.ceil(256 / 128) * 2.5
    down = 256 * 512 * 0.5 + 256 * math.ceil(512 / 128) * 2.5
    assert a.weight_bytes_by_part["dense_mlp"] == 4 * (2 * gate_up + down)
    assert a.weight_bytes_by_part["lm_head"] == 2 * 1000 * 256            # not converted


def test_fp8_per_tensor_and_gptq_per_channel():
    a = from_hf_config({**TINY, "quantization_config": {"quant_method": "fp8"}})
    p = tiny_linear_params()
    assert a.weight_bytes_by_part["dense_mlp"] == 4 * (p["mlp"] + 3 * 4)
    g = from_hf_config({**TINY, "quantization_config": {"quant_method": "gptq", "bits": 8,
                                                        "group_size": -1}})
    assert g.weight_bytes_by_part["dense_mlp"] == 4 * (p["mlp"] + (512 + 512 + 256) * 3)


def test_qwen_moe_sparse_step_and_mlp_only_layers():
    cfg = {**TINY, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
           "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    a = from_hf_config(cfg)
    # layers 0..3: MoE where (i + 1) % 2 == 0 and i not in [3] -> only layer 1
    assert (a.n_moe_layers, a.n_dense_mlp_layers) == (1, 3)
    assert a.expected_experts_touched(0) == 0
    assert a.expected_experts_touched(10_000) == pytest.approx(8)


def test_expected_experts_when_every_expert_is_routed():
    cfg = {**TINY, "num_experts": 4, "num_experts_per_tok": 4, "moe_intermediate_size": 128}
    np.testing.assert_allclose(from_hf_config(cfg).expected_experts_touched([0, 1, 5]), [0, 4, 4])


def test_gated_deltanet_hybrid_with_output_gate():
    cfg = {**TINY, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
           "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
           "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "attn_output_gate": True}
    a = from_hf_config(cfg)
    assert (a.linear_kind, a.n_linear_layers, a.n_full_attn_layers) == ("gdn", 3, 1)
    assert a.kv_bytes_per_token("bf16") == 1 * 2 * 2 * 64 * 2
    # per GDN layer: 4 value heads x 32 x 32 fp32 state + (4 - 1) x (2 x 2 x 32 + 4 x 32)
    # conv channels in bf16
    assert a.state_bytes_per_seq("bf16") == 3 * (4 * 32 * 32 * 4 + 3 * 256 * 2) == 53_760
    gdn = (2 * 64 + 2 * 128) * 256 + 8 * 256 + 256 * 128 + 256 * 4 + 8 + 32
    attn = 2 * 256 * 256 + 2 * 128 * 256 + 256 * 256          # q_proj doubled by the gate
    assert a.weight_bytes_by_part["linear_attention"] == 2 * 3 * gdn
    assert a.weight_bytes_by_part["attention"] == 2 * attn
    cfg.pop("layer_types")
    cfg["full_attention_interval"] = 4                         # Qwen3-Next without layer_types
    assert from_hf_config(cfg).arch_hash == a.arch_hash


def test_nemotron_h_mamba2_blocks():
    """Nemotron-3-Nano's blocks: 23 Mamba2 mixers, 6 attention mixers, 23 MoE feed-forwards
    (relu2 experts: up and down only); its state is what SGLang 0.5.16 allocates per request
    (ssm fp32, conv bf16: 49,082,368 B) and its published size 31.6B parameters, 3.2B active."""
    a = preset("nemotron-3-nano-30b-a3b")
    assert (a.n_layers, a.n_full_attn_layers, a.n_linear_layers, a.n_moe_layers,
            a.n_dense_mlp_layers, a.n_sublayers) == (52, 6, 23, 23, 0, 52)
    assert (a.linear_kind, a.linear_heads, a.linear_head_dim, a.linear_value_head_dim,
            a.linear_conv_channels) == ("mamba2", 64, 128, 64, 6144)
    assert a.kv_bytes_per_token() == 6 * 2 * 2 * 128 * 2
    assert a.state_bytes_per_seq() == 23 * (64 * 64 * 128 * 4 + 3 * 6144 * 2) == 49_082_368
    assert a.total_params == pytest.approx(31.58e9, rel=0.005)
    assert a.active_params_per_token == pytest.approx(3.23e9, rel=0.01)
    # an expert is up (1856 x 2688) and down (2688 x 1856), no gate
    assert a.routed_expert_params == 2 * 1856 * 2688


def test_qwen3_next_fp8_hybrid():
    """Qwen3-Next-80B-A3B in block FP8: 36 Gated DeltaNet and 12 attention layers; in_proj_ba,
    routers and the lm_head in bf16 (modules_to_not_convert, per layer)."""
    a = preset("qwen3-next-80b-a3b-fp8")
    assert (a.n_full_attn_layers, a.n_linear_layers, a.linear_kind, a.n_sublayers) == (
        12, 36, "gdn", 96)
    assert a.kv_bytes_per_token() == 24_576
    assert a.state_bytes_per_seq() == 36 * (32 * 128 * 128 * 4 + 3 * 8192 * 2) == 77_266_944
    assert a.total_params == pytest.approx(79.6e9, rel=0.005)
    assert a.weight_bytes == pytest.approx(80.3e9, rel=0.005)
    assert dict(a.part_dtypes)["lm_head"] == "bf16"


def test_llama4_chunked_attention_and_interleaved_moe():
    cfg = {**TINY, "model_type": "llama4_text", "attention_chunk_size": 16,
           "interleave_moe_layer_step": 2, "num_local_experts": 4, "num_experts_per_tok": 1,
           "intermediate_size": 128, "intermediate_size_mlp": 512}
    a = from_hf_config(cfg)
    # RoPE layers (all but every 4th) attend within chunks of 16: at most 16 tokens kept
    assert (a.n_sliding_layers, a.sliding_window, a.n_full_attn_layers) == (3, 16, 1)
    # MoE on layers 1 and 3, each with one shared expert of the expert size; dense MLPs 512
    assert (a.n_moe_layers, a.n_shared_experts, a.shared_intermediate) == (2, 1, 128)
    assert a.dense_intermediate == 512
    assert a.weight_bytes_by_part["dense_mlp"] == 2 * 2 * 3 * 256 * 512


def test_moe_layer_freq_as_per_layer_flags():
    cfg = {**TINY, "n_routed_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 64, "moe_layer_freq": [0, 1, 1, 0]}
    assert from_hf_config(cfg).n_moe_layers == 2
    with pytest.raises(ArchConfigError) as info:
        from_hf_config({**cfg, "moe_layer_freq": [0, 1]})
    assert info.value.field == "hf_config.moe_layer_freq"


# ---- bad configs ---------------------------------------------------------------------------

KIMI = preset_config("kimi-k3")


def _k3(**changes):
    cfg = copy.deepcopy(KIMI)
    cfg["text_config"].update(changes)
    return cfg


@pytest.mark.parametrize("cfg,field", [
    ([], "hf_config"),
    ({}, "hf_config.num_hidden_layers"),
    ({**TINY, "num_hidden_layers": "4"}, "hf_config.num_hidden_layers"),
    ({**TINY, "num_hidden_layers": 0}, "hf_config.num_hidden_layers"),
    ({**TINY, "hidden_size": 2.5}, "hf_config.hidden_size"),
    ({**TINY, "vocab_size": None}, "hf_config.vocab_size"),
    ({**TINY, "num_key_value_heads": 3}, "hf_config.num_key_value_heads"),
    ({**TINY, "head_dim": None, "hidden_size": 250}, "hf_config.hidden_size"),
    ({**TINY, "layer_types": ["full_attention"] * 3}, "hf_config.layer_types"),
    ({**TINY, "layer_types": ["full_attention", "mamba"] * 2}, "hf_config.layer_types"),
    ({**TINY, "layer_types": ["sliding_attention"] * 4}, "hf_config.sliding_window"),
    ({**TINY, "layer_types": ["linear_attention"] * 4}, "hf_config.linear_attn_config"),
    ({**TINY, "tie_word_embeddings": "yes"}, "hf_config.tie_word_embeddings"),
    ({**TINY, "torch_dtype": "int3"}, "hf_config.torch_dtype"),
    ({**TINY, "num_experts": 4, "num_experts_per_tok": 6, "moe_intermediate_size": 64},
     "hf_config.num_experts_per_tok"),
    ({**TINY, "num_experts": 4}, "hf_config.num_experts_per_tok"),
    ({**TINY, "kv_lora_rank": 512}, "hf_config.qk_rope_head_dim"),
    ({**TINY, "quantization_config": {"quant_method": "bitsandbytes"}},
     "hf_config.quantization_config.quant_method"),
    ({**TINY, "quantization_config": {"quant_method": "compressed-tensors"}},
     "hf_config.quantization_config.config_groups"),
    ({**TINY, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}},
     "hf_config.quantization_config.weight_block_size"),
    ({**TINY, "quantization_config": "fp8"}, "hf_config.quantization_config"),
    ({"text_config": "llama"}, "hf_config.text_config"),
    (_k3(linear_attn_config={"num_heads": 96, "head_dim": 128}),
     "hf_config.text_config.linear_attn_config.full_attn_layers"),
    (_k3(linear_attn_config={**KIMI["text_config"]["linear_attn_config"],
                             "full_attn_layers": [4, 94]}),
     "hf_config.text_config.linear_attn_config.full_attn_layers"),
    (_k3(linear_attn_config={**KIMI["text_config"]["linear_attn_config"],
                             "kda_layers": [1, 2]}),
     "hf_config.text_config.linear_attn_config.kda_layers"),
    (_k3(linear_attn_config={**KIMI["text_config"]["linear_attn_config"], "num_heads": -96}),
     "hf_config.text_config.linear_attn_config.num_heads"),
    (_k3(routed_expert_hidden_size=True), "hf_config.text_config.routed_expert_hidden_size"),
    ({**TINY, "hybrid_override_pattern": "M-M*"}, "hf_config.mamba_num_heads"),
    ({**TINY, "hybrid_override_pattern": "M-M"}, "hf_config.hybrid_override_pattern"),
    ({**TINY, "hybrid_override_pattern": "M-X*"}, "hf_config.hybrid_override_pattern"),
    ({**TINY, "hybrid_override_pattern": "ME-*", "mamba_num_heads": 8, "mamba_head_dim": 16,
      "ssm_state_size": 16}, "hf_config.n_routed_experts"),
    ({**TINY, "hybrid_override_pattern": "M-M*", "mamba_num_heads": 8, "mamba_head_dim": 16,
      "ssm_state_size": 16, "n_groups": 3}, "hf_config.n_groups"),
    ({**TINY, "mamba_d_state": 16}, "hf_config.mamba_d_state"),
    ({**TINY, "compress_ratios": [4, 4, 4, 4]}, "hf_config.compress_ratios"),
    ({**TINY, "global_head_dim": 512}, "hf_config.global_head_dim"),
    ({**TINY, "layer_types": ["linear_attention"] * 4, "linear_num_value_heads": 4},
     "hf_config.linear_num_key_heads"),
])
def test_bad_config_names_the_field(cfg, field):
    with pytest.raises(ArchConfigError) as info:
        from_hf_config(cfg)
    assert info.value.field == field
    assert str(info.value).startswith(field + ": ")
    assert isinstance(info.value, ValueError)


def test_bad_kv_dtype_and_unknown_preset():
    with pytest.raises(ArchConfigError) as info:
        preset("llama-3.1-8b").kv_bytes_per_token("int4")
    assert info.value.field == "kv_cache_dtype"
    with pytest.raises(ArchConfigError) as info:
        preset("llama-4")
    assert info.value.field == "preset" and "kimi-k3" in str(info.value)
