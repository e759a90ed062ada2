"""A bounded LRU of serialised responses, keyed by (model version, canonical request).

The recommender is deterministic for a given model, so identical workloads (deployment tools
ask the same few questions over and over) are answered from here. The model version is part of
the key: a reload never serves an answer of the previous model.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict


def cache_key(canonical: bytes) -> bytes:
    """A fixed-size key, so a large request (an inline hf_config) costs no more memory."""
    return hashlib.blake2b(canonical, digest_size=20).digest()


class ResponseCache:
    def __init__(self, size: int):
        self.size = size
        self._data: OrderedDict[tuple[str, bytes], tuple[bytes, tuple[str, ...]]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: tuple[str, bytes]) -> tuple[bytes, tuple[str, ...]] | None:
        if self.size <= 0:
            return None
        try:
            value = self._data[key]
        except KeyError:
            self.misses += 1
            return None
        self._data.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: tuple[str, bytes], value: tuple[bytes, tuple[str, ...]]) -> None:
        if self.size <= 0:
            return
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
