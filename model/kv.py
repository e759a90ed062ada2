"""KV-cache bytes per token from a Hugging Face config.json, a preset, or a given number."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

KvDtype = Literal["bf16", "fp16", "fp8"]
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp8": 1}


@dataclass(frozen=True)
class KvLayout:
    """What a model stores per context token, independent of how it is parallelised.

    ``attention`` is ``mla`` (one latent per layer, duplicated on every TP rank), ``gqa``
    (``kv_heads`` heads sharded over TP ranks) or ``unknown`` (treated like MLA: duplicated,
    the conservative assumption, and DCP constraints are not checked).
    """

    bytes_per_token: int
    attention: Literal["mla", "gqa", "unknown"] = "unknown"
    kv_heads: int | None = None
    weight_bytes: float | None = None

    def shards(self, tp: int) -> int:
        """Over how many TP ranks one token's KV is split (1 = every rank holds all of it)."""
        if self.attention == "gqa" and self.kv_heads:
            return max(1, min(tp, self.kv_heads))
        return 1


class KvConfigError(ValueError):
    """A config.json or preset that cannot give KV bytes per token; ``field`` names the culprit."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


# name -> (layout fields at 16-bit KV, weight bytes or None when unpublished)
PRESETS: dict[str, dict[str, Any]] = {
    # MLA: 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64)
    "kimi-k3": {"attention": "mla", "layers": 61, "latent": 576, "weights": None,
                "note": "assumed Kimi-K2 / DeepSeek-V3 MLA layout (reference.md section 1)"},
    "kimi-k2": {"attention": "mla", "layers": 61, "latent": 576, "weights": 1.03e12},
    "deepseek-v3": {"attention": "mla", "layers": 61, "latent": 576, "weights": 6.71e11},
    "deepseek-v2-lite": {"attention": "mla", "layers": 27, "latent": 576, "weights": 3.14e10},
    "llama-3.1-8b": {"attention": "gqa", "layers": 32, "kv_heads": 8, "head_dim": 128,
                     "weights": 1.61e10},
    "llama-3.1-70b": {"attention": "gqa", "layers": 80, "kv_heads": 8, "head_dim": 128,
                      "weights": 1.41e11},
    "qwen3-235b-a22b": {"attention": "gqa", "layers": 94, "kv_heads": 4, "head_dim": 128,
                        "weights": 4.70e11},
}


def from_preset(name: str, dtype: KvDtype) -> KvLayout:
    p = PRESETS.get(name)
    if p is None:
        raise KvConfigError("preset",
                            f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    b = DTYPE_BYTES[dtype]
    if p["attention"] == "mla":
        return KvLayout(p["layers"] * p["latent"] * b, "mla", None, p["weights"])
    per = 2 * p["layers"] * p["kv_heads"] * p["head_dim"] * b
    return KvLayout(per, "gqa", p["kv_heads"], p["weights"])


def _int(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise KvConfigError(f"hf_config.{key}", "missing (needed to compute KV bytes per token)")
    if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
            or v <= 0 or int(v) != v):
        raise KvConfigError(f"hf_config.{key}", f"must be a positive integer, got {v!r}")
    return int(v)


def _full_attention_layers(cfg: dict[str, Any], layers: int) -> int:
    """Layers whose KV grows with context: hybrid models list ``layer_types``."""
    types = cfg.get("layer_types")
    if types is None:
        return layers
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise KvConfigError("hf_config.layer_types", "must be a list of strings")
    full = sum(1 for t in types if t in ("full_attention", "attention", "global"))
    if full == 0:
        raise KvConfigError("hf_config.layer_types", "no full-attention layer: KV does not grow "
                            "with context, so there is nothing to model")
    return full


def from_hf_config(cfg: Any, dtype: KvDtype) -> KvLayout:
    if not isinstance(cfg, dict):
        raise KvConfigError("hf_config", "must be a JSON object (the contents of config.json)")
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LLM inside
        cfg = {**cfg["text_config"]}
    b = DTYPE_BYTES[dtype]
    layers = _full_attention_layers(cfg, _int(cfg, "num_hidden_layers"))
    if "kv_lora_rank" in cfg:
        latent = _int(cfg, "kv_lora_rank") + _int(cfg, "qk_rope_head_dim")
        return KvLayout(layers * latent * b, "mla")
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", heads)
    if cfg.get("head_dim") is not None:
        head_dim = _int(cfg, "head_dim")
    else:
        hidden = _int(cfg, "hidden_size")
        if hidden % heads:
            raise KvConfigError("hf_config.hidden_size", "not divisible by num_attention_heads")
        head_dim = hidden // heads
    if heads % kv_heads:
        raise KvConfigError("hf_config.num_key_value_heads",
                            f"{kv_heads} does not divide num_attention_heads {heads}")
    return KvLayout(2 * layers * kv_heads * head_dim * b, "gqa", kv_heads)  # MHA: kv_heads == heads
