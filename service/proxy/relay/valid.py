"""What the relay checks before it passes an answer on: JSON bodies, JSON SSE data lines.

Every ``data:`` line of a streamed answer must be JSON or ``[DONE]``, and a whole answer must be
JSON: what an OpenAI client parses, so garbage never reaches one as a success. Each event is
parsed (orjson, about a microsecond per event); a value orjson refuses is tried once more with
Python's ``json``, which also takes ``NaN``, ``Infinity`` and lone surrogate escapes, as the
Python clients do.
"""

from __future__ import annotations

import json

import orjson

_loads = orjson.loads


def is_json(data: bytes) -> bool:
    try:
        _loads(data)
        return True
    except ValueError:
        pass
    try:
        json.loads(data)
        return True
    except (ValueError, RecursionError):
        return False


def first_invalid(events: bytes) -> int:
    """Where, in ``events`` (whole SSE events), the first event with a ``data:`` line that is
    neither JSON nor ``[DONE]`` begins; -1 when there is none. Other fields (``event:``,
    ``id:``, comments) are not looked at."""
    if b"\r" in events:                   # CRLF (or CR) line ends: line by line
        return _first_invalid_lines(events)
    at = 0
    for ev in events.split(b"\n\n"):
        if ev[:6] == b"data: " and b"\n" not in ev:      # one data line: the usual event
            value = ev[6:]
            if value != b"[DONE]":
                try:
                    _loads(value)
                except ValueError:
                    if not is_json(value):
                        return at
        elif ev and _first_invalid_lines(ev) >= 0:
            return at
        at += len(ev) + 2
    return -1


def _first_invalid_lines(events: bytes) -> int:
    at = start = 0
    for line in events.split(b"\n"):
        at += len(line) + 1
        if line[:5] == b"data:":
            value = line[6:] if line[5:6] == b" " else line[5:]
            if value[-1:] == b"\r":
                value = value[:-1]
            if value != b"[DONE]" and not is_json(value):
                return start
        elif not line or line == b"\r":
            start = at                  # an event ends: the next begins after this line
    return -1
