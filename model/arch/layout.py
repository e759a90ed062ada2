"""Layer kinds, attention geometry and MoE layout of a decoder, from its config.json.

Conventions (Hugging Face's): layer indices are 0-based except Kimi Linear's
``linear_attn_config.full_attn_layers`` / ``kda_layers``, which are 1-based (the last layer of
Kimi-K3, 93, is listed). A layer is MoE when the config has routed experts and:
DeepSeek / Kimi: ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0`` (or
``moe_layer_freq[i]`` when it is a per-layer list); Qwen-MoE: ``i not in mlp_only_layers`` and
``(i + 1) % decoder_sparse_step == 0``; Llama 4: ``(i + 1) % interleave_moe_layer_step == 0``.
Sliding-window layers: ``layer_types`` when given; else Qwen2/3-style ``use_sliding_window``
with layers from ``max_window_layers`` on; else every layer when ``sliding_window`` is set
(Mistral-style), unless ``use_sliding_window`` is false. Llama 4's chunked-attention layers
(the RoPE layers of ``no_rope_layers``, chunks of ``attention_chunk_size``) are treated as
sliding-window layers of that size (an upper bound on what a sequence keeps).
Linear attention: Kimi Delta Attention (``linear_attn_config``), Gated DeltaNet (Qwen3-Next /
Qwen3.5: ``linear_num_key_heads``, ``linear_num_value_heads``, ``linear_key_head_dim``,
``linear_value_head_dim``, ``linear_conv_kernel_dim``) or Mamba2 in Nemotron-H's block layout
(``hybrid_override_pattern``: one character per block, ``M`` a Mamba2 mixer, ``*`` an attention
mixer, ``-`` a dense MLP, ``E`` a MoE; each block holds a mixer or a feed-forward, not both;
``mamba_num_heads`` x ``mamba_head_dim``, ``ssm_state_size``, ``n_groups``, ``conv_kernel``).
Other Mamba hybrids (Jamba, Falcon-H1, Granite-4.0-H), DeepSeek-V4 compressed attention, NAS
block configs and per-kind attention geometries (Gemma 4, MiMo-V2) are refused with an
``ArchConfigError`` rather than modelled wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_advisor.model.arch.config import ArchConfigError, Config

FULL, SLIDING, LINEAR, NONE = "full", "sliding", "linear", "none"   # NONE: no mixer
DENSE, MOE = "dense", "moe"                  # a block's feed-forward (or NONE)
_PATTERN = {"M": (LINEAR, NONE), "*": (FULL, NONE), "-": (NONE, DENSE), "E": (NONE, MOE)}
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
    output_gate: bool = False    # MLA: Kimi-K3's output gate, hidden -> heads x v_head_dim;
    #                              GQA: attn_output_gate (Qwen3-Next), q_proj twice as wide
    bias: bool = False


@dataclass(frozen=True)
class LinearAttention:
    """A linear-attention mixer with a constant per-sequence state: per value head a dk x dv
    recurrent state, and a short causal convolution over ``conv_channels`` channels (q, k and
    v). Mamba2 maps onto the same record: a head's state is ``ssm_state_size`` (dk: B and C
    are its keys and queries, one pair per group) x ``mamba_head_dim`` (dv), and the
    convolution runs over x, B and C."""

    kind: str                    # "kda" (Kimi Delta Attention) | "gdn" (Gated DeltaNet) | "mamba2"
    heads: int                   # value heads: one recurrent state each
    key_heads: int               # key heads (Mamba2: B / C groups)
    head_dim: int                # key head dim (dk; Mamba2: the SSM state size)
    value_head_dim: int          # dv
    conv_kernel: int
    full_rank_gate: bool = False

    @property
    def conv_channels(self) -> int:
        return 2 * self.key_heads * self.head_dim + self.heads * self.value_head_dim


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
    kinds: tuple[str, ...]       # per layer: its mixer, full | sliding | linear | none
    ffn: tuple[str, ...]         # per layer: its feed-forward, dense | moe | none
    sliding_window: int | None
    attention: Attention
    linear: LinearAttention | None
    moe: Moe | None
    dense_intermediate: int
    gated_mlp: bool = True       # gate, up and down projections (False: up and down, relu2)

    @property
    def moe_layers(self) -> tuple[bool, ...]:
        return tuple(f == MOE for f in self.ffn)

    @property
    def sublayers(self) -> int:
        """Mixers and feed-forwards: each ends in a row-parallel projection (an all-reduce at
        TP > 1) and costs about half a standard decoder layer's kernel launches."""
        return sum(k != NONE for k in self.kinds) + sum(f != NONE for f in self.ffn)


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
                     output_gate=cfg.bool("attn_output_gate", False), bias=bias)


def block_pattern(cfg: Config, n_layers: int) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Nemotron-H's ``hybrid_override_pattern``: (mixer kinds, feed-forwards) per block."""
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is None:
        return None
    if not isinstance(pattern, str) or len(pattern) != n_layers:
        raise ArchConfigError(cfg.field("hybrid_override_pattern"), "must be a string of one "
                              f"character per block, {n_layers} (num_hidden_layers)")
    bad = sorted(set(pattern) - set(_PATTERN))
    if bad:
        raise ArchConfigError(cfg.field("hybrid_override_pattern"), f"unknown block type(s) "
                              f"{bad}; known: M (Mamba2), * (attention), - (MLP), E (MoE)")
    return (tuple(_PATTERN[c][0] for c in pattern), tuple(_PATTERN[c][1] for c in pattern))


def layer_kinds(cfg: Config, n_layers: int) -> tuple[tuple[str, ...], int | None]:
    lin = cfg.sub("linear_attn_config")
    types = cfg.str_list("layer_types")
    blocks = block_pattern(cfg, n_layers)
    if blocks is not None:
        kinds = blocks[0]
    elif types is not None:
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
    elif cfg.has("linear_num_value_heads") and cfg.has("full_attention_interval"):
        every = cfg.int("full_attention_interval")             # Qwen3-Next without layer_types
        kinds = tuple(FULL if (i + 1) % every == 0 else LINEAR for i in range(n_layers))
    elif cfg.has("attention_chunk_size") and str(cfg.get("model_type", "")).startswith("llama4"):
        rope = cfg.int_list("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(n_layers)]
        if len(rope) != n_layers:
            raise ArchConfigError(cfg.field("no_rope_layers"), f"has {len(rope)} entries for "
                                  f"num_hidden_layers {n_layers}")
        kinds = tuple(SLIDING if r else FULL for r in rope)
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
    if LINEAR in kinds and lin is None and blocks is None and not cfg.has(
            "linear_num_value_heads"):
        raise ArchConfigError(cfg.field("linear_attn_config"), "missing: linear-attention "
                              "layers need Kimi Linear's linear_attn_config or Gated DeltaNet's "
                              "linear_num_value_heads / linear_key_head_dim keys")
    return kinds, window


def linear_attention(cfg: Config) -> LinearAttention | None:
    lin = cfg.sub("linear_attn_config")
    if lin is not None:
        heads, dim = lin.int("num_heads"), lin.int("head_dim")
        return LinearAttention("kda", heads, heads, dim, dim, lin.int("short_conv_kernel_size", 4),
                               lin.bool("use_full_rank_gate", False))
    if cfg.has("hybrid_override_pattern"):
        if "M" not in str(cfg.get("hybrid_override_pattern")):
            return None
        heads, groups = cfg.int("mamba_num_heads"), cfg.int("n_groups", 1)
        if heads % groups:
            raise ArchConfigError(cfg.field("n_groups"), f"{groups} does not divide "
                                  f"mamba_num_heads {heads}")
        return LinearAttention("mamba2", heads, groups, cfg.int("ssm_state_size"),
                               cfg.int("mamba_head_dim"), cfg.int("conv_kernel", 4))
    if cfg.has("linear_num_value_heads"):
        return LinearAttention("gdn", cfg.int("linear_num_value_heads"),
                               cfg.int("linear_num_key_heads"), cfg.int("linear_key_head_dim"),
                               cfg.int("linear_value_head_dim"),
                               cfg.int("linear_conv_kernel_dim", 4))
    return None


_MAMBA_KEYS = ("mamba_num_heads", "ssm_state_size", "mamba_n_heads", "mamba_d_state",
               "mamba_d_ssm", "state_size")
_UNSUPPORTED = (("compress_ratios", "compressed attention (DeepSeek-V4) is not modelled"),
                ("block_configs", "per-block NAS layouts (Nemotron NAS) are not modelled"),
                ("global_head_dim", "a separate geometry for global layers (Gemma 4) is not "
                 "modelled"),
                ("swa_num_key_value_heads", "a separate geometry for sliding-window layers "
                 "(MiMo-V2) is not modelled"))


def refuse_unsupported(cfg: Config) -> None:
    if not cfg.has("hybrid_override_pattern"):
        for key in _MAMBA_KEYS:
            if cfg.has(key):
                raise ArchConfigError(cfg.field(key), "Mamba layers are modelled in Nemotron-H's "
                                      "block layout (hybrid_override_pattern) only; this "
                                      "hybrid (Jamba, Falcon-H1, Granite-4.0-H style) is not")
    for key, message in _UNSUPPORTED:
        if cfg.has(key):
            raise ArchConfigError(cfg.field(key), message)


def _first(cfg: Config, *keys: str) -> str | None:
    return next((k for k in keys if cfg.has(k)), None)


def moe(cfg: Config, hidden: int, n_layers: int) -> tuple[Moe | None, tuple[bool, ...]]:
    key = _first(cfg, "n_routed_experts", "num_experts", "num_local_experts")
    pattern = cfg.has("hybrid_override_pattern")
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
    if pattern:                                           # Nemotron-H: shared experts' width
        shared_inter = n_shared * cfg.int("moe_shared_expert_intermediate_size",
                                          expert_inter, minimum=0)
    elif cfg.has("shared_expert_intermediate_size"):      # Qwen2-MoE: one shared MLP
        shared_inter = cfg.int("shared_expert_intermediate_size", minimum=0)
        n_shared = max(n_shared, 1 if shared_inter else 0)
    elif str(cfg.get("model_type", "")).startswith("llama4"):   # one shared expert per layer
        n_shared, shared_inter = 1, expert_inter
    else:
        shared_inter = n_shared * expert_inter
    latent = cfg.opt_int("routed_expert_hidden_size") or hidden
    first_dense = cfg.int("first_k_dense_replace", 0, minimum=0)
    step = cfg.int("decoder_sparse_step", cfg.int("interleave_moe_layer_step", 1))
    dense_only = set(cfg.int_list("mlp_only_layers") or [])
    if isinstance(cfg.get("moe_layer_freq"), list):              # per-layer 0/1 flags
        flags = cfg.int_list("moe_layer_freq")
        if len(flags) != n_layers:
            raise ArchConfigError(cfg.field("moe_layer_freq"), f"has {len(flags)} entries for "
                                  f"num_hidden_layers {n_layers}")
        by_freq = [bool(f) for f in flags]
    else:
        freq = cfg.int("moe_layer_freq", 1)
        by_freq = [i % freq == 0 for i in range(n_layers)]
    layers = tuple(i >= first_dense and by_freq[i] and (i + 1) % step == 0
                   and i not in dense_only for i in range(n_layers))
    router_bias = cfg.get("topk_method") == "noaux_tc" or pattern   # Nemotron-H: score bias
    return Moe(n_routed, per_token, n_shared, expert_inter, latent, shared_inter,
               router_bias), layers


def layout(cfg: Config) -> Layout:
    refuse_unsupported(cfg)
    n_layers = cfg.int("num_hidden_layers")
    hidden = cfg.int("hidden_size")
    kinds, window = layer_kinds(cfg, n_layers)
    blocks = block_pattern(cfg, n_layers)
    if blocks is not None:                  # Nemotron-H: the pattern places the experts
        ffn = blocks[1]
        moe_cfg = moe(cfg, hidden, n_layers)[0] if MOE in ffn else None
        if MOE in ffn and moe_cfg is None:
            raise ArchConfigError(cfg.field("n_routed_experts"), "missing: "
                                  "hybrid_override_pattern has MoE blocks (E)")
    else:
        moe_cfg, moe_layers = moe(cfg, hidden, n_layers)
        ffn = tuple(MOE if m else DENSE for m in moe_layers)
    dense_inter = 0
    if DENSE in ffn:
        dense_inter = cfg.int("intermediate_size_mlp" if cfg.has("intermediate_size_mlp")
                              else "intermediate_size")
    # Nemotron-H's MLPs and experts: up and down projections around a squared ReLU
    gated = str(cfg.get("mlp_hidden_act", cfg.get("hidden_act", "silu"))) != "relu2"
    return Layout(kinds, ffn, window, attention(cfg), linear_attention(cfg), moe_cfg,
                  dense_inter, gated)
