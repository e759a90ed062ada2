"""The routing facts of a long request body without decoding it.

A decision reads a handful of facts from an OpenAI body: the model, ``stream``, the output
limit and the prompt's size (the UTF-8 bytes of its text, or the count of its token ids). A long
body is almost all prompt, so decoding it whole (a Python ``str`` of megabytes, then a second
copy when it is encoded again to count its bytes) costs about 3 ms per MB on the event loop,
where nothing else runs meanwhile. ``skim`` walks the body's structure instead and steps over
each long string with ``bytes.find`` (a string's end is its first quote not escaped), so a 4 MB
chat body costs well under a millisecond:

- a string's UTF-8 bytes are its raw bytes less one per escape (``\\n``, ``\\"``, ``\\\\`` ...
  each stand for one byte); a string with a ``\\u`` escape is decoded, so the count is exact;
- a list of token ids is counted by its commas, after checking that it holds only digits,
  signs, commas and white space.

The facts are the ones ``engine_advisor.service.proxy.request.parse`` would find, and the body is
decoded whole only if something asks for it (a local tokenizer or the upstream's ``/tokenize``,
asked only when the decision depends on the exact count). What skimming does not check, the
engine does: inside a long string, bytes that are not UTF-8, control characters and escapes;
and the form of each token id. Anything of a shape it does not read (a body that is not one
object, messages that are not objects, a batch of prompts) gives None, and the caller decodes
the body whole, answering 400 where it is not JSON.
"""

from __future__ import annotations

import json

WS = b" \t\r\n"
DIGITS = b"0123456789"
ID_CHARS = b",-" + WS
OPEN = frozenset(b"[{")
CLOSE = frozenset(b"]}")
QUOTE, BACKSLASH = 0x22, 0x5C
# below this many bytes decoding is faster than skimming (the C scanner beats a walk in Python)
SKIM_BYTES = 64 * 1024


class Skipped(Exception):
    """The body is not of a shape skimming reads: decode it whole."""


class Facts:
    """What a decision reads from a body (``request.ProxyRequest``'s fields)."""

    __slots__ = ("model", "stream", "max_tokens", "max_completion_tokens", "messages",
                 "prompt_ids", "prompt_bytes", "has_prompt")

    def __init__(self) -> None:
        self.model = self.stream = self.max_tokens = self.max_completion_tokens = None
        self.messages: int | None = None      # how many messages (None: no messages key)
        self.prompt_ids: int | None = None
        self.prompt_bytes = 0
        self.has_prompt = False


def skim(raw: bytes) -> Facts | None:
    """The facts of an OpenAI chat or completions body, or None (module docstring)."""
    try:
        return _Walk(raw).body()
    except (Skipped, IndexError, ValueError, RecursionError):
        return None


class _Walk:
    __slots__ = ("raw", "pos", "facts")

    def __init__(self, raw: bytes):
        self.raw, self.pos, self.facts = raw, 0, Facts()

    # --------------------------------------------------------------------- lexing
    def ws(self) -> int:
        raw, i = self.raw, self.pos
        while raw[i] in WS:
            i += 1
        self.pos = i
        return raw[i]

    def expect(self, ch: int) -> None:
        if self.ws() != ch:
            raise Skipped
        self.pos += 1

    def string_end(self) -> int:
        """The position after the string that starts at ``pos`` (its opening quote)."""
        raw, i = self.raw, self.pos + 1
        while True:
            j = raw.find(b'"', i)
            if j < 0:
                raise Skipped
            k = j - 1
            while raw[k] == BACKSLASH:
                k -= 1
            if (j - 1 - k) % 2 == 0:      # an even run of backslashes: the quote ends it
                return j + 1
            i = j + 1

    def string_bytes(self) -> int:
        """The UTF-8 bytes of the string at ``pos``, decoded; moves past it."""
        raw, a = self.raw, self.pos
        b = self.string_end()
        self.pos = b
        if raw.find(b"\\", a, b) < 0:        # memchr: a tenth of what counting costs
            return b - a - 2
        escapes = raw.count(b"\\", a, b)
        if raw.find(b"\\u", a, b) >= 0:
            text = json.loads(raw[a:b])
            return len(text.encode("utf-8", errors="replace"))
        # every escape but \uXXXX is two characters for one byte; a pair of backslashes is one
        return b - a - 2 - (escapes - raw.count(b"\\\\", a, b))

    def small(self) -> object:
        """A value decoded (for the few short ones a decision reads); moves past it."""
        a = self.pos
        self.skip()
        return json.loads(self.raw[a:self.pos])

    def skip(self) -> None:
        """Moves past the value at ``pos`` (strings stepped over by ``find``)."""
        raw = self.raw
        ch = self.ws()
        if ch == QUOTE:
            self.pos = self.string_end()
            return
        if ch not in OPEN:
            i = self.pos
            while raw[i] not in b",]} \t\r\n":
                i += 1
            if i == self.pos:
                raise Skipped
            self.pos = i
            return
        depth = 0
        i = self.pos
        while True:
            c = raw[i]
            if c == QUOTE:
                self.pos = i
                i = self.string_end()
                continue
            if c in OPEN:
                depth += 1
            elif c in CLOSE:
                depth -= 1
                if depth == 0:
                    self.pos = i + 1
                    return
            i += 1

    def members(self):
        """The keys of the object at ``pos``, each with ``pos`` at its value; the caller
        moves past each value."""
        self.expect(ord("{"))
        if self.ws() == ord("}"):
            self.pos += 1
            return
        while True:
            if self.ws() != QUOTE:
                raise Skipped
            a = self.pos
            self.pos = self.string_end()
            key = self.raw[a + 1:self.pos - 1]
            if b"\\" in key:
                key = json.loads(self.raw[a:self.pos]).encode()
            self.expect(ord(":"))
            self.ws()
            yield key
            c = self.ws()
            self.pos += 1
            if c == ord("}"):
                return
            if c != ord(","):
                raise Skipped

    # --------------------------------------------------------------------- the body
    def body(self) -> Facts:
        f = self.facts
        for key in self.members():
            if key == b"messages":
                self.messages()
            elif key == b"prompt":
                self.prompt()
            elif key in (b"model", b"stream", b"max_tokens", b"max_completion_tokens"):
                setattr(f, key.decode(), self.small())
            else:
                self.skip()
        if self.pos != len(self.raw) and self.raw[self.pos:].strip(WS):
            raise Skipped
        return f

    def messages(self) -> None:
        """A list of message objects: their content's bytes, as ``request._content_text``
        joins them."""
        f = self.facts
        self.expect(ord("["))
        count = total = 0
        if self.ws() == ord("]"):
            self.pos += 1
        else:
            while True:
                count += 1
                size = 0
                for key in self.members():
                    if key == b"content":
                        size = self.content()
                    else:
                        self.skip()
                total += size
                c = self.ws()
                self.pos += 1
                if c == ord("]"):
                    break
                if c != ord(","):
                    raise Skipped
        f.messages, f.prompt_bytes = count, total

    def content(self) -> int:
        ch = self.ws()
        if ch == QUOTE:
            return self.string_bytes()
        if ch != ord("["):
            self.skip()
            return 0
        self.pos += 1
        texts = size = 0
        if self.ws() == ord("]"):
            self.pos += 1
            return 0
        while True:
            if self.ws() == ord("{"):
                text = None
                for key in self.members():
                    if key == b"text" and self.ws() == QUOTE:
                        text = self.string_bytes()
                    else:
                        if key == b"text":
                            text = None
                        self.skip()
                if text is not None:
                    texts += 1
                    size += text
            else:
                self.skip()
            c = self.ws()
            self.pos += 1
            if c == ord("]"):
                return size + max(0, texts - 1)     # parts joined by newlines
            if c != ord(","):
                raise Skipped

    def prompt(self) -> None:
        """A string, or one list of token ids (anything else: decoded whole)."""
        f = self.facts
        f.has_prompt = True
        ch = self.ws()
        if ch == QUOTE:
            f.prompt_ids, f.prompt_bytes = None, self.string_bytes()
            return
        if ch != ord("["):
            raise Skipped
        a = self.pos + 1
        b = self.raw.find(b"]", a)
        if b < 0:
            raise Skipped
        span = self.raw[a:b]
        rest = span.translate(None, DIGITS)
        if rest.translate(None, ID_CHARS):
            raise Skipped                 # not only integers (strings, lists, booleans ...)
        stripped = span.strip(WS)
        if not stripped or stripped[:1] not in b"-0123456789" or stripped[-1:] not in DIGITS:
            raise Skipped                 # empty, or a stray comma: let the decoder say so
        f.prompt_ids = len(rest) - len(rest.translate(None, b",")) + 1
        f.prompt_bytes = 0
        self.pos = b + 1
