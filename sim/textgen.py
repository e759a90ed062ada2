"""Deterministic generated text: which tokens a request produces and when it stops.

Every output token is one of ``WORDS`` (each a single token of the simulator's tokenizer, so
re-tokenizing the output gives back exactly the tokens sent). Token ``i`` of a request is
``TABLE[(offset + i * stride) % len(TABLE)]`` with offset and stride from a hash of the server
seed, the request seed and the prompt ids: the same prompt and seeds give the same text.

Without ``ignore_eos`` a request stops at a deterministic pseudo end-of-sequence after
``natural`` tokens (1 ... MAX_NATURAL, from the same hash), never before ``min_tokens``.
"""

from __future__ import annotations

import hashlib
import json
import random
from array import array
from dataclasses import dataclass

from sim.tokenizer import encode

WORDS = (" the", " of", " and", " to", " in", " is", " it", " for", " on", " was", " as",
         " at", " by", " an", " be", " are", " or", " has", " not", " but", " can", " all",
         " one", " we", " you", " new", " now", " may", " way", " use", " two", " who", " its",
         " out", " day", " get", " see", " him", " how", " our", " set", " old", " big", " end",
         " why", " let", " put", " say", " own", " few", " run", " low", " far", " top", " key",
         " GPU", " KV", " HBM", " DCP", " tok", ",", ".", " 42", " 7")
WORD_IDS = tuple(encode(w)[0] for w in WORDS)
WORD_JSON = tuple(json.dumps(w)[1:-1] for w in WORDS)   # escaped, without the quotes
TABLE_SIZE = 4096
TABLE = array("H", random.Random(20251129).choices(range(len(WORDS)), k=TABLE_SIZE))
MAX_NATURAL = 512


@dataclass(frozen=True)
class OutputPlan:
    """What a request will generate: ``n`` tokens, then ``finish_reason``."""

    offset: int
    stride: int
    n: int
    finish_reason: str

    def indices(self, start: int, stop: int) -> list[int]:
        """Word indices of output tokens ``start .. stop - 1``."""
        off, st = self.offset, self.stride
        return [TABLE[(off + i * st) % TABLE_SIZE] for i in range(start, stop)]

    def text(self, start: int, stop: int) -> str:
        return "".join(WORDS[w] for w in self.indices(start, stop))

    def token_ids(self, start: int, stop: int) -> list[int]:
        return [WORD_IDS[w] for w in self.indices(start, stop)]


def plan_output(prompt_ids: list[int], *, server_seed: int, request_seed: int | None,
                max_tokens: int, min_tokens: int, ignore_eos: bool) -> OutputPlan:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{server_seed}/{request_seed}/".encode())
    h.update(array("q", prompt_ids).tobytes())
    d = int.from_bytes(h.digest(), "little")
    offset = d % TABLE_SIZE
    stride = 2 * ((d >> 12) % (TABLE_SIZE // 2)) + 1      # odd: visits the whole table
    natural = 1 + (d >> 24) % MAX_NATURAL
    if ignore_eos:
        return OutputPlan(offset, stride, max_tokens, "length")
    n = max(natural, min_tokens)
    if n >= max_tokens:
        return OutputPlan(offset, stride, max_tokens, "length")
    return OutputPlan(offset, stride, n, "stop")
