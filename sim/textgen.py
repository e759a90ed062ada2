"""Deterministic generated text: which tokens a request produces and when it stops.

Every output token is one of the words of a ``Vocab``: ``WORDS`` for the built-in tokenizer
(each a single token of it, so re-tokenizing the output gives back exactly the tokens sent);
with a Hugging Face tokenizer the words of ``WORDS`` that are single tokens of it (else tokens
of its vocabulary). Token ``i`` of a request is word ``TABLE[(offset + i * stride) % len(TABLE)]``
(modulo the number of words) with offset and stride from a hash of the server seed, the request
seed and the prompt ids: the same prompt and seeds give the same text.

Without ``ignore_eos`` a request stops at a deterministic pseudo end-of-sequence after
``natural`` tokens (1 ... MAX_NATURAL, from the same hash), never before ``min_tokens``.
"""

from __future__ import annotations

import hashlib
import json
import random
from array import array
from dataclasses import dataclass

from engine_advisor.sim.tokenizer import BUILTIN, Tokenizer

WORDS = (" the", " of", " and", " to", " in", " is", " it", " for", " on", " was", " as",
         " at", " by", " an", " be", " are", " or", " has", " not", " but", " can", " all",
         " one", " we", " you", " new", " now", " may", " way", " use", " two", " who", " its",
         " out", " day", " get", " see", " him", " how", " our", " set", " old", " big", " end",
         " why", " let", " put", " say", " own", " few", " run", " low", " far", " top", " key",
         " GPU", " KV", " HBM", " DCP", " tok", ",", ".", " 42", " 7")
TABLE_SIZE = 4096
TABLE = array("H", random.Random(20251129).choices(range(len(WORDS)), k=TABLE_SIZE))
MAX_NATURAL = 512
MIN_WORDS = 8


class Vocab:
    """The output words of one tokenizer: text, token id and JSON-escaped text of each."""

    def __init__(self, tok: Tokenizer = BUILTIN):
        pairs = []
        for w in WORDS:
            ids = tok.encode(w)
            if len(ids) == 1 and tok.decode(ids) == w:
                pairs.append((w, ids[0]))
        if len(pairs) < MIN_WORDS:       # a vocabulary without English words: take its tokens
            pairs = []
            for t in range(tok.vocab_size):
                text = tok.token_str(t)
                if t != tok.eos_token_id and text.strip().isalnum() and text.isascii():
                    pairs.append((text, t))
                if len(pairs) == len(WORDS):
                    break
        if not pairs:
            raise ValueError(f"tokenizer {tok.name}: no token decodes to plain text")
        self.words = tuple(w for w, _ in pairs)
        self.ids = tuple(i for _, i in pairs)
        self.json = tuple(json.dumps(w)[1:-1] for w in self.words)  # escaped, without quotes
        n = len(self.words)
        self.table = TABLE if n == len(WORDS) else array("H", (w % n for w in TABLE))


BUILTIN_VOCAB = Vocab()


@dataclass(frozen=True)
class OutputPlan:
    """What a request will generate: ``n`` tokens, then ``finish_reason``."""

    offset: int
    stride: int
    n: int
    finish_reason: str
    vocab: Vocab = BUILTIN_VOCAB

    def indices(self, start: int, stop: int) -> list[int]:
        """Word indices of output tokens ``start .. stop - 1``."""
        off, st, table = self.offset, self.stride, self.vocab.table
        return [table[(off + i * st) % TABLE_SIZE] for i in range(start, stop)]

    def text(self, start: int, stop: int) -> str:
        words = self.vocab.words
        return "".join(words[w] for w in self.indices(start, stop))

    def token_ids(self, start: int, stop: int) -> list[int]:
        ids = self.vocab.ids
        return [ids[w] for w in self.indices(start, stop)]


def plan_output(prompt_ids: list[int], *, server_seed: int, request_seed: int | None,
                max_tokens: int, min_tokens: int, ignore_eos: bool,
                vocab: Vocab = BUILTIN_VOCAB) -> OutputPlan:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{server_seed}/{request_seed}/".encode())
    h.update(array("q", prompt_ids).tobytes())
    d = int.from_bytes(h.digest(), "little")
    offset = d % TABLE_SIZE
    stride = 2 * ((d >> 12) % (TABLE_SIZE // 2)) + 1      # odd: visits the whole table
    natural = 1 + (d >> 24) % MAX_NATURAL
    if ignore_eos:
        return OutputPlan(offset, stride, max_tokens, "length", vocab)
    n = max(natural, min_tokens)
    if n >= max_tokens:
        return OutputPlan(offset, stride, max_tokens, "length", vocab)
    return OutputPlan(offset, stride, n, "stop", vocab)
