"""Prefix caching: prompts that share leading blocks of tokens with earlier prompts prefill less.

Blocks of ``BLOCK`` tokens are identified by a chained hash (block i's hash covers every token
before it, as in vLLM's automatic prefix caching); the cache keeps the most recently used
blocks up to the KV capacity. A hit skips the prefill of the cached tokens (at least one token
is always computed) and shows in the engines' cache metrics.
"""

from __future__ import annotations

from collections import OrderedDict

BLOCK = 16


class PrefixCache:
    def __init__(self, capacity_tokens: int, enabled: bool = True):
        self.enabled = enabled
        self.max_blocks = max(capacity_tokens // BLOCK, 1)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def clear(self) -> None:
        """Forget every cached block (SGLang /flush_cache)."""
        self._blocks.clear()

    def lookup_and_insert(self, ids: list[int]) -> int:
        """Tokens of ``ids`` already cached as a prefix; then remember all of its blocks."""
        if not self.enabled:
            return 0
        blocks = self._blocks
        h = 0
        hits = 0
        prefix = True
        for start in range(0, len(ids) - BLOCK + 1, BLOCK):
            h = hash((h, *ids[start:start + BLOCK]))
            if prefix and h in blocks:
                hits += 1
                blocks.move_to_end(h)
            else:
                prefix = False
                blocks[h] = None
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)
        return min(hits * BLOCK, max(len(ids) - 1, 0))
