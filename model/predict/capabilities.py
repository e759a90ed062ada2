"""What each engine supports (``Engine.capabilities`` in model/engines/, from the engines'
documentation) and the names a requirement may use for it (model/data/capabilities.json).

``exclusions`` turns a workload's ``Requirements`` into a reason per engine that cannot serve it;
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel

from engine_advisor.model import engines
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.workload import Requirements

CAPABILITIES_JSON = Path(__file__).parents[1] / "data" / "capabilities.json"


class Capabilities(BaseModel):
    """The shared vocabulary: where the engines' lists come from and the aliases of
    quantization formats and speculative methods."""

    schema_version: int
    source: str
    notes: list[str] = []
    aliases: dict[str, dict[str, str]] = {}

    def canonical(self, kind: str, name: str) -> str:
        key = name.strip().lower()
        return self.aliases.get(kind, {}).get(key, key.replace("-", "_"))


@lru_cache(maxsize=1)
def load_capabilities(path: Path = CAPABILITIES_JSON) -> Capabilities:
    return Capabilities.model_validate(json.loads(path.read_text(encoding="utf-8")))


def _active(req: Requirements) -> set[str]:
    """Requirement names that are switched on (for incompatibility rules)."""
    on = {name for name in ("hardware_vendor", "quantization", "speculative_method")
          if getattr(req, name) is not None}
    on |= {name for name in ("pipeline_parallel", "lora", "dp_attention") if getattr(req, name)}
    return on


def engine_exclusion(engine: str, req: Requirements, layout: ModelShape,
                     caps: Capabilities | None = None) -> str | None:
    """Why ``engine`` cannot meet ``req``, or None when it can."""
    caps = caps or load_capabilities()
    c = engines.get(engine).capabilities
    if req.hardware_vendor and req.hardware_vendor not in c.hardware_vendors:
        return (f"{engine} does not run on {req.hardware_vendor} hardware "
                f"(supported: {', '.join(c.hardware_vendors)})")
    if req.quantization:
        q = caps.canonical("quantization", req.quantization)
        if q not in c.quantization:
            return f"{engine} does not support quantization {req.quantization!r}"
    if req.speculative_method:
        s = caps.canonical("speculative_method", req.speculative_method)
        if s not in c.speculative_methods:
            return (f"{engine} does not support speculative decoding method "
                    f"{req.speculative_method!r} (supported: {', '.join(c.speculative_methods)})")
    if req.pipeline_parallel and not c.pipeline_parallel:
        return f"{engine} does not support pipeline parallelism"
    if req.lora and not c.lora:
        return f"{engine} does not serve LoRA adapters"
    if req.dp_attention:
        if not c.dp_attention:
            return f"{engine} has no DP-attention (data-parallel attention for MLA models)"
        if layout.attention in ("gqa", "mha"):
            return "DP-attention applies to MLA models; this model uses GQA attention"
    on = _active(req)
    for rule in c.incompatible:
        if set(rule.when) <= on:
            return rule.reason
    return None


def exclusions(req: Requirements | None, layout: ModelShape) -> dict[str, str]:
    """engine -> reason for every registered engine that cannot meet ``req``."""
    if req is None:
        return {}
    caps = load_capabilities()
    out = {}
    for engine in engines.names():
        reason = engine_exclusion(engine, req, layout, caps)
        if reason:
            out[engine] = reason
    return out
