"""The simulator's own deterministic, invertible tokenizer.

Text is cut into pieces of at most four printable ASCII characters (an optional leading space
plus up to three letters or digits, one punctuation mark, or a run of up to four spaces); each
such piece has a fixed id computed from its characters (base 95), so no table is needed and
every id decodes back to its text. Any other character (newline, tab, non-ASCII) becomes one
token per UTF-8 byte (ids 0-255). ``decode(encode(s)) == s`` for every string.

``sim --tokenizer PATH`` replaces it by a Hugging Face ``tokenizer.json`` (``HFTokenizer``) so
that prompt counts equal a client's that uses the same file; both offer the methods of
``BuiltinTokenizer``.
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
    """A token id outside the vocabulary, or text that cannot be tokenized."""


@lru_cache(maxsize=65536)
def _piece_ids(piece: str) -> tuple[int, ...]:
    if len(piece) == 1 and not (" " <= piece <= "~"):
        try:
            return tuple(piece.encode("utf-8"))
        except UnicodeEncodeError:      # a lone surrogate: no character, no UTF-8 bytes
            raise TokenError(f"text holds the lone surrogate \\u{ord(piece):04x}, which is "
                             "not a character") from None
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


class BuiltinTokenizer:
    """The simulator's own tokenizer as an object (the default of ``sim``)."""

    name = "builtin"
    vocab_size = VOCAB_SIZE
    eos_token_id = 0            # NUL: a byte token that generated text never contains

    encode = staticmethod(encode)
    decode = staticmethod(decode)
    token_str = staticmethod(token_str)
    check_ids = staticmethod(check_ids)


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (needs the optional ``tokenizers`` package)."""

    def __init__(self, path: str):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenError(f"{path} needs the 'tokenizers' package (pip install "
                             "'engine-advisor[tokenizer]')") from None
        try:
            self._tok = Tokenizer.from_file(path)
        except Exception as exc:    # the library raises its own exception types
            raise TokenError(f"cannot load {path}: {exc}") from None
        self.name = path
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        if self.vocab_size < 2:
            raise TokenError(f"{path}: the vocabulary has {self.vocab_size} token(s)")
        special = [t.content for t in self._tok.get_added_tokens_decoder().values()
                   if t.special]
        eos = next((s for s in special if any(k in s.lower() for k in ("eos", "end", "</s>"))),
                   special[0] if special else None)
        self.eos_token_id = self._tok.token_to_id(eos) if eos is not None else 0

    def encode(self, text: str) -> list[int]:
        # as the engines' benchmark clients count prompts: no special tokens added
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        why = self.check_ids(ids)
        if why:
            raise TokenError(why)
        return self._tok.decode(ids, skip_special_tokens=False)

    def token_str(self, token: int) -> str:
        return self._tok.decode([token], skip_special_tokens=False)

    def check_ids(self, ids: object) -> str | None:
        if not isinstance(ids, list):
            return "must be a list of token ids"
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool):
                return f"token ids must be integers, got {t!r}"
            if not 0 <= t < self.vocab_size:
                return f"token id {t} is out of vocabulary (0 .. {self.vocab_size - 1})"
        return None


Tokenizer = BuiltinTokenizer | HFTokenizer
BUILTIN = BuiltinTokenizer()


def load(path: str | None) -> Tokenizer:
    """The tokenizer of ``sim --tokenizer PATH`` (None: the built-in one)."""
    return BUILTIN if path is None else HFTokenizer(path)
