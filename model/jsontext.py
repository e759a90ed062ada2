"""Request bodies as JSON, refused for every reason a parser has, each named.

Python's ``json`` raises ``JSONDecodeError`` for bad syntax, ``UnicodeDecodeError`` for bytes
that are not text, ``RecursionError`` for arrays or objects nested past the interpreter's
limit and ``ValueError`` for an integer of more than ``sys.get_int_max_str_digits()`` digits
(4,300); and it accepts a ``\\ud800`` escape that stands for no character (a lone surrogate),
which cannot be encoded as UTF-8 again and which the engines' own parser (pydantic's) refuses.
``loads`` turns all of these into ``BadJson`` with a short reason: the service, the proxy and
the simulator answer it with 400 and log nothing (a client's mistake).
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

# what json.loads raises for a client's bytes (JSONDecodeError, UnicodeDecodeError and the
# integer-digits limit are ValueErrors)
PARSE_ERRORS = (ValueError, RecursionError)
SURROGATE_ESCAPES = (b"\\ud", b"\\uD")
ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")    # one in UTF-8 form (json.loads passes it)


class BadJson(ValueError):
    """A body that is not JSON text; the message says why."""


def reason(exc: BaseException) -> str:
    """Why a JSON parser refused a body, in words a client can act on."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, UnicodeDecodeError):
        return f"the body cannot be decoded as text: {exc.reason} at byte {exc.start}"
    if isinstance(exc, json.JSONDecodeError):
        return str(exc)
    text = str(exc)
    if "integer string conversion" in text:
        return f"an integer has more than {sys.get_int_max_str_digits():,} digits"
    return text[:200] or type(exc).__name__


def _lone_surrogate(value: Any) -> str | None:
    """The first string inside ``value`` that holds a lone surrogate, or None."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"\\u{ord(v[exc.start]):04x}"
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def check_text(raw: bytes, value: Any) -> None:
    """Refuse a parsed body whose strings hold a lone surrogate (only looked for when the raw
    bytes have such an escape or bytes: a scan of the bytes, not of the value, as a rule)."""
    if raw.find(SURROGATE_ESCAPES[0]) < 0 and raw.find(SURROGATE_ESCAPES[1]) < 0 and (
            raw.find(b"\xed") < 0 or ENCODED_SURROGATE.search(raw) is None):
        return
    bad = _lone_surrogate(value)
    if bad is not None:
        raise BadJson(f"a string holds the lone surrogate {bad}, which is not a character")


def loads(raw: bytes | str) -> Any:
    """``json.loads`` with every refusal a ``BadJson``."""
    try:
        value = json.loads(raw)
    except PARSE_ERRORS as exc:
        raise BadJson(reason(exc)) from None
    check_text(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw, value)
    return value
