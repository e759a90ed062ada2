"""Layer kinds, attention geometry and MoE layout of a decoder, from its config.json.

Conventions (Hugging Face's): layer indices are 0-based except Kimi Linear's
``linear_attn_config.full_attn_layers`` / ``kda_layers``, which are 1-based (the last layer of
Kimi-K3, 93, is listed). A layer is MoE when the config has routed experts and:
DeepSeek / Kimi: ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``;
Qwen-MoE: ``i not in mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``.
Sliding-window layers: ``layer_types`` when given; else Qwen2/3-style ``use_sliding_window``
with layers from ``max_window_layers`` on; else every layer when ``sliding_window`` is set
(Mistral-style), unless ``use_sliding_window`` is false.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.arch.config import ArchConfigError, Config

FULL, SLIDING, LINEAR = "full", "sliding", "linear"
_TYPE_NAMES = {"full_attention": FULL, "attention": FULL, "global": FULL, "global_attention": FULL,
               "sliding_attention": SLIDING, "sliding_window": SLIDING, "local": SLIDING,
               "local_attention": SLIDING, "chunked_attention": SLIDING,
               "linear_attention": LINEAR}


@dataclass(frozen=True)
class Attention:
    kind: str                    # "mla" | "gqa" | "mha"
    q_heads: int
    kv_heads: int                # 1 for MLA (one latent per token)
    head_dim: int                # query/key head dim (MLA: qk_nope + qk_rope)
    v_head_dim: int
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    q_lora_rank: int | None = None
    output_gate: bool = False    # Kimi-K3's mla_use_output_gate: hidden -> heads x v_head_dim
    bias: bool = False


@dataclass(frozen=True)
class LinearAttention:
    """Kimi Delta Attention (``linear_attn_config``): per head a dk x dv recurrent state."""

    heads: int
    head_dim: int
    conv_kernel: int
    full_rank_gate: bool


@dataclass(frozen=True)
class Moe:
    n_routed: int
    per_token: int
    n_shared: int
    expert_intermediate: int
    expert_hidden: int           # the width experts run at: hidden, or a latent-MoE width
    shared_intermediate: int     # all shared experts together
    router_bias: bool            # e_score_correction_bias (noaux_tc) per expert


@dataclass(frozen=True)
class Layout:
    kinds: tuple[str, ...]       # per layer: full | sliding | linear
    moe_layers: tuple[bool, ...]
    sliding_window: int | None
    attention: Attention
    linear: LinearAttention | None
    moe: Moe | None
    dense_intermediate: int


def attention(cfg: Config) -> Attention:
    heads = cfg.int("num_attention_heads")
    if cfg.has("kv_lora_rank"):
        rope, nope = cfg.int("qk_rope_head_dim"), cfg.int("qk_nope_head_dim")
        return Attention("mla", heads, 1, nope + rope, cfg.int("v_head_dim"),
                         kv_lora_rank=cfg.int("kv_lora_rank"), qk_rope_head_dim=rope,
                         qk_nope_head_dim=nope, q_lora_rank=cfg.opt_int("q_lora_rank"),
                         output_gate=cfg.bool("mla_use_output_gate", False),
                         bias=cfg.bool("attention_bias", False))
    kv_heads = cfg.int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise ArchConfigError(cfg.field("num_key_value_heads"),
                              f"{kv_heads} does not divide num_attention_heads {heads}")
    if cfg.has("head_dim"):
        head_dim = cfg.int("head_dim")
    else:
        hidden = cfg.int("hidden_size")
        if hidden % heads:
            raise ArchConfigError(cfg.field("hidden_size"),
                                  f"{hidden} is not divisible by num_attention_heads {heads}")
        head_dim = hidden // heads
    bias = cfg.bool("attention_bias", cfg.get("model_type") == "qwen2")
    return Attention("mha" if kv_heads == heads else "gqa", heads, kv_heads, head_dim, head_dim,
                     bias=bias)


def layer_kinds(cfg: Config, n_layers: int) -> tuple[tuple[str, ...], int | None]:
    lin = cfg.sub("linear_attn_config")
    types = cfg.str_list("layer_types")
    if types is not None:
        if len(types) != n_layers:
            raise ArchConfigError(cfg.field("layer_types"), f"has {len(types)} entries for "
                                  f"num_hidden_layers {n_layers}")
        unknown = sorted({t for t in types if t not in _TYPE_NAMES})
        if unknown:
            raise ArchConfigError(cfg.field("layer_types"), f"unknown layer type(s) {unknown}; "
                                  f"known: {', '.join(sorted(_TYPE_NAMES))}")
        kinds = tuple(_TYPE_NAMES[t] for t in types)
    elif lin is not None:
        full = lin.int_list("full_attn_layers", minimum=1)
        if full is None:
            raise ArchConfigError(lin.field("full_attn_layers"), "missing (1-based indices of "
                                  "the full-attention layers)")
        bad = [i for i in full if i > n_layers]
        if bad:
            raise ArchConfigError(lin.field("full_attn_layers"), f"layer(s) {bad} beyond "
                                  f"num_hidden_layers {n_layers} (indices are 1-based)")
        kda = lin.int_list("kda_layers", minimum=1)
        if kda is not None and sorted(set(kda) | set(full)) != list(range(1, n_layers + 1)):
            raise ArchConfigError(lin.field("kda_layers"), "together with full_attn_layers "
                                  f"must list each of the layers 1..{n_layers} once")
        kinds = tuple(FULL if i + 1 in set(full) else LINEAR for i in range(n_layers))
    else:
        window = cfg.opt_int("sliding_window")
        use = cfg.get("use_sliding_window")
        if window is None or use is False:
            kinds = (FULL,) * n_layers
        elif cfg.has("max_window_layers"):
            start = cfg.int("max_window_layers", minimum=0)
            kinds = tuple(SLIDING if i >= start else FULL for i in range(n_layers))
        else:
            kinds = (SLIDING,) * n_layers
    window = None
    if SLIDING in kinds:
        window = cfg.opt_int("sliding_window") or cfg.opt_int("attention_chunk_size")
        if window is None:
            raise ArchConfigError(cfg.field("sliding_window"),
                                  "missing (layer_types lists sliding-window layers)")
    if LINEAR in kinds and lin is None:
        raise ArchConfigError(cfg.field("linear_attn_config"), "missing: linear-attention "
                              "layers are modelled for Kimi Linear's linear_attn_config only")
    return kinds, window


def linear_attention(cfg: Config) -> LinearAttention | None:
    lin = cfg.sub("linear_attn_config")
    if lin is None:
        return None
    return LinearAttention(lin.int("num_heads"), lin.int("head_dim"),
                           lin.int("short_conv_kernel_size", 4),
                           lin.bool("use_full_rank_gate", False))


def _first(cfg: Config, *keys: str) -> str | None:
    return next((k for k in keys if cfg.has(k)), None)


def moe(cfg: Config, hidden: int, n_layers: int) -> tuple[Moe | None, tuple[bool, ...]]:
    key = _first(cfg, "n_routed_experts", "num_experts", "num_local_experts")
    if key is None or cfg.int(key, minimum=0) == 0:
        return None, (False,) * n_layers
    n_routed = cfg.int(key)
    k_key = _first(cfg, "num_experts_per_tok", "num_experts_per_token", "moe_topk") \
        or "num_experts_per_tok"
    per_token = cfg.int(k_key)
    if per_token > n_routed:
        raise ArchConfigError(cfg.field(k_key), f"{per_token} exceeds the {n_routed} experts")
    inter_key = "moe_intermediate_size" if cfg.has("moe_intermediate_size") else \
        "intermediate_size"
    expert_inter = cfg.int(inter_key)
    n_shared = cfg.int(_first(cfg, "n_shared_experts", "num_shared_experts")
                       or "n_shared_experts", 0, minimum=0)
    if cfg.has("shared_expert_intermediate_size"):       # Qwen2-MoE: one shared MLP
        shared_inter = cfg.int("shared_expert_intermediate_size", minimum=0)
        n_shared = max(n_shared, 1 if shared_inter else 0)
    else:
        shared_inter = n_shared * expert_inter
    latent = cfg.opt_int("routed_expert_hidden_size") or hidden
    first_dense = cfg.int("first_k_dense_replace", 0, minimum=0)
    freq = cfg.int("moe_layer_freq", 1)
    step = cfg.int("decoder_sparse_step", 1)
    dense_only = set(cfg.int_list("mlp_only_layers") or [])
    layers = tuple(i >= first_dense and i % freq == 0 and (i + 1) % step == 0
                   and i not in dense_only for i in range(n_layers))
    router_bias = cfg.get("topk_method") == "noaux_tc"
    return Moe(n_routed, per_token, n_shared, expert_inter, latent, shared_inter,
               router_bias), layers


def layout(cfg: Config) -> Layout:
    n_layers = cfg.int("num_hidden_layers")
    hidden = cfg.int("hidden_size")
    kinds, window = layer_kinds(cfg, n_layers)
    moe_cfg, moe_layers = moe(cfg, hidden, n_layers)
    dense_inter = 0
    if not all(moe_layers):
        dense_inter = cfg.int("intermediate_size")
    return Layout(kinds, moe_layers, window, attention(cfg), linear_attention(cfg), moe_cfg,
                  dense_inter)
