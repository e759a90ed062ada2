"""A bounded LRU of serialised responses, keyed by (model version, canonical request).

The recommender is deterministic for a given model, so identical workloads (deployment tools
ask the same few questions over and over) are answered from here. The model version is part of
the key: a reload never serves an answer of the previous model.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

Key = tuple[str, bytes]
Value = tuple[bytes, tuple[str, ...]]


def cache_key(canonical: bytes) -> bytes:
    """A fixed-size key, so a large request (an inline hf_config) costs no more memory."""
    return hashlib.blake2b(canonical, digest_size=20).digest()


class ResponseCache:
    """A least-recently-used map of at most ``size`` answers (an ``OrderedDict``, whose moves
    and evictions run in C), with hit and miss counts; size 0 turns it off."""

    def __init__(self, size: int):
        self.size = size
        self._data: OrderedDict[Key, Value] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: Key) -> Value | None:
        if self.size <= 0:
            return None
        value = self._data.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
            self._data.move_to_end(key)
        return value

    def put(self, key: Key, value: Value) -> None:
        if self.size > 0:
            data = self._data
            data[key] = value
            data.move_to_end(key)
            if len(data) > self.size:
                data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
