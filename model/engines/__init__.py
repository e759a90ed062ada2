"""The serving engines engine-advisor knows, one module each (README.md: how to add one).

``get(name)`` returns an engine's ``Engine`` record, ``names()`` every registered name in the
order recommendations list them, ``defaults()`` those a workload naming no engines considers.
Resolve the record once per configuration, not per row.
"""

from __future__ import annotations

from engine_advisor.model.engines import sglang, trtllm, vllm
from engine_advisor.model.engines.base import Engine

REGISTRY: dict[str, Engine] = {e.name: e for e in (vllm.ENGINE, sglang.ENGINE, trtllm.ENGINE)}


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


_DEFAULTS: list = [None, ()]      # (the registry they were read from: its id and size, names)


def defaults() -> tuple[str, ...]:
    """The engines a workload naming none is answered with (``Engine.default_candidate``):
    vLLM and SGLang; TensorRT-LLM, known only by its priors, where a workload names it. Read
    again when an engine is added to the registry or the registry replaced (every workload's
    query key asks)."""
    key = (id(REGISTRY), len(REGISTRY))
    if _DEFAULTS[0] != key:
        _DEFAULTS[:] = key, tuple(n for n, e in REGISTRY.items() if e.default_candidate)
    return _DEFAULTS[1]


def effective_share(engine: str, share: float, context_tokens: float) -> float:
    """The share of a prompt an engine finds in its prefix cache when ``share`` of it could be:
    whole cache blocks only (vLLM hashes blocks of 16 tokens, TensorRT-LLM reuses blocks of 32,
    SGLang's radix tree is token-granular), so a partial last block is recomputed."""
    if share <= 0 or context_tokens <= 0:
        return 0.0
    block = get(engine).capabilities.prefix_reuse.block_tokens
    return (share * context_tokens // block) * block / context_tokens
