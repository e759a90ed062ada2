"""The serving engines engine-advisor knows, one module each (README.md: how to add one).

``get(name)`` returns an engine's ``Engine`` record, ``names()`` every registered name in the
order recommendations list them. Resolve the record once per configuration, not per row.
"""

from __future__ import annotations

from model.engines import sglang, vllm
from model.engines.base import Engine

REGISTRY: dict[str, Engine] = {e.name: e for e in (vllm.ENGINE, sglang.ENGINE)}


class UnknownEngine(KeyError):
    """An engine name no module registers."""

    def __str__(self) -> str:
        return f"unknown engine {self.args[0]!r}; known: {', '.join(REGISTRY)}"


def get(name: str) -> Engine:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UnknownEngine(name) from None


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)
