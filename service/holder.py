"""The loaded model, swapped atomically on reload.

Requests read ``holder.current`` once and use that snapshot throughout, so a reload in the
middle of a request never mixes two models. A failed load leaves ``current`` untouched.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_advisor.model.fit.artifact import build_metadata, load
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.default import REFERENCE_CSV, default_model


@dataclass(frozen=True)
class LoadedModel:
    model: CostModel
    meta: dict[str, Any]
    source: str
    loaded_at: str = field(default_factory=lambda: dt.datetime.now(dt.UTC)
                           .isoformat(timespec="seconds"))
    # the model's version, a field (read by every routing decision's cache key)
    version: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "version", self.model.version)


def load_default() -> LoadedModel:
    model = default_model()
    meta = build_metadata(model, hashlib.sha256(REFERENCE_CSV.read_bytes()).hexdigest())
    # No artifact file: the version is the default model's, not a file hash.
    meta.update(model_version=model.version, artifact_sha256=None)
    return LoadedModel(model, meta, f"embedded default ({REFERENCE_CSV.name})")


def load_artifact(path: Path) -> LoadedModel:
    """Raises engine_advisor.model.fit.artifact.ArtifactError with the reason when the file is
    refused."""
    model, meta = load(path)
    return LoadedModel(model, meta, str(path))


class ModelHolder:
    def __init__(self, initial: LoadedModel):
        self.current = initial
        self._lock = asyncio.Lock()

    async def reload(self, path: Path) -> LoadedModel:
        """Load ``path`` off the event loop and swap it in; raises on failure (old model kept)."""
        async with self._lock:
            loaded = await asyncio.to_thread(load_artifact, path)
            self.current = loaded
            return loaded
