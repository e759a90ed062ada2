"""A served model's architecture from its Hugging Face config.json or a preset: layer kinds,
attention geometry, MoE layout, weight bytes, KV / state bytes and FLOPs (see architecture)."""

from engine_advisor.model.arch.architecture import (
           KV_DTYPE_BYTES,
           Architecture,
           from_hf_config,
           kv_dtype_bytes,
)
from engine_advisor.model.arch.config import ArchConfigError
from engine_advisor.model.arch.presets import PRESETS, preset, preset_config, preset_source

__all__ = ["KV_DTYPE_BYTES", "PRESETS", "ArchConfigError", "Architecture", "from_hf_config",
           "kv_dtype_bytes", "preset", "preset_config", "preset_source"]
