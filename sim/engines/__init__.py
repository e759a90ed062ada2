"""The engines the simulator imitates, one module each (model/engines/README.md: how to add
one). ``get(name)`` returns its ``SimEngine``."""

from __future__ import annotations

from engine_advisor.sim.engines import sglang, trtllm, vllm
from engine_advisor.sim.engines.base import SimEngine

__all__ = ["SimEngine", "get", "names"]

REGISTRY: dict[str, SimEngine] = {e.name: e for e in (vllm.ENGINE, sglang.ENGINE, trtllm.ENGINE)}


def get(name: str) -> SimEngine:
    return REGISTRY[name]


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)
