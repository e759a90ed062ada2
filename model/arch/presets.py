"""Presets: real config.json contents shipped in ``model/data/presets/<name>.json``, each with a
``_source`` key saying where the config comes from."""

from __future__ import annotations

import json
from pathlib import Path

from engine_advisor.model.arch.architecture import Architecture, from_hf_config
from engine_advisor.model.arch.config import ArchConfigError

PRESET_DIR = Path(__file__).resolve().parent.parent / "data" / "presets"
PRESETS: tuple[str, ...] = ("kimi-k3", "kimi-k2", "deepseek-v3", "deepseek-v2-lite",
                            "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b",
                            "qwen3-235b-a22b", "qwen3-32b", "qwen3-30b-a3b", "mixtral-8x7b",
                            "qwen3-next-80b-a3b-fp8", "nemotron-3-nano-30b-a3b")


def preset_config(name: str) -> dict:
    """The stored config.json contents of a preset (``_source`` included)."""
    if name not in PRESETS:
        raise ArchConfigError("preset", f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return json.loads((PRESET_DIR / f"{name}.json").read_text())


def preset_source(name: str) -> str:
    return preset_config(name)["_source"]


def preset(name: str) -> Architecture:
    """The architecture of a preset. Parses the shipped config each call (about a millisecond):
    callers on a hot path keep the result."""
    return from_hf_config(preset_config(name), name=name)
