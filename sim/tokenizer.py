"""The simulator's own deterministic, invertible tokenizer.

Text is cut into pieces of at most four printable ASCII characters (an optional leading space
plus up to three letters or digits, one punctuation mark, or a run of up to four spaces); each
such piece has a fixed id computed from its characters (base 95), so no table is needed and
every id decodes back to its text. Any other character (newline, tab, non-ASCII) becomes one
token per UTF-8 byte (ids 0-255). ``decode(encode(s)) == s`` for every string.
"""

from __future__ import annotations

import re
from functools import lru_cache

N_BYTES = 256
N_PRINTABLE = 95                 # ' ' (32) ... '~' (126)
MAX_PIECE = 4
_OFFSETS = [0]
for _length in range(1, MAX_PIECE + 1):
    _OFFSETS.append(_OFFSETS[-1] + N_PRINTABLE**_length)
VOCAB_SIZE = N_BYTES + _OFFSETS[MAX_PIECE]

_PIECE = re.compile(r" ?[A-Za-z]{1,3}| ?[0-9]{1,3}| ?[!-/:-@\[-`{-~]| {1,4}|[^ -~]")


class TokenError(ValueError):
    """A token id outside the vocabulary."""


@lru_cache(maxsize=65536)
def _piece_ids(piece: str) -> tuple[int, ...]:
    if len(piece) == 1 and not (" " <= piece <= "~"):
        return tuple(piece.encode("utf-8"))
    value = 0
    for ch in piece:
        value = value * N_PRINTABLE + (ord(ch) - 32)
    return (N_BYTES + _OFFSETS[len(piece) - 1] + value,)


@lru_cache(maxsize=65536)
def _id_bytes(token: int) -> bytes:
    if token < N_BYTES:
        return bytes((token,))
    rest = token - N_BYTES
    length = 1
    while rest >= _OFFSETS[length]:
        length += 1
    value = rest - _OFFSETS[length - 1]
    chars = []
    for _ in range(length):
        value, digit = divmod(value, N_PRINTABLE)
        chars.append(32 + digit)
    return bytes(reversed(chars))


def encode(text: str) -> list[int]:
    """Token ids of ``text``."""
    ids: list[int] = []
    for piece in _PIECE.findall(text):
        ids.extend(_piece_ids(piece))
    return ids


def decode(ids: list[int]) -> str:
    """Text of token ids (invalid UTF-8 from byte tokens becomes U+FFFD)."""
    why = check_ids(ids)
    if why:
        raise TokenError(why)
    return b"".join(_id_bytes(t) for t in ids).decode("utf-8", errors="replace")


def token_str(token: int) -> str:
    return _id_bytes(token).decode("utf-8", errors="replace")


def check_ids(ids: object) -> str | None:
    """Why ``ids`` is not a list of valid token ids, or None."""
    if not isinstance(ids, list):
        return "must be a list of token ids"
    for t in ids:
        if not isinstance(t, int) or isinstance(t, bool):
            return f"token ids must be integers, got {t!r}"
        if not 0 <= t < VOCAB_SIZE:
            return f"token id {t} is out of vocabulary (0 .. {VOCAB_SIZE - 1})"
    return None
