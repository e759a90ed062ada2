"""What the picker reads of an ext_proc ``ProcessingRequest``, read from its bytes.

The gRPC server hands the picker each message as the bytes Envoy sent; the picker reads the
few fields it uses from the protobuf wire format, as slices of those bytes, and builds no
protobuf objects. What a picker costs in a gateway is mostly the memory it touches per
request: between two messages, Envoy and the engines evict it from the CPU caches, and each
line touched again is a miss (bench/epp_cold.py). Reading a decoded message touches much:
a Python wrapper per header, map entry and ``Struct`` value, each made by protobuf's C code.
Warm, reading a request's three messages this way costs about 1 µs more than decoding them;
with the caches cold it costs less (docs/gateway.md has the figures).

The wire format's rules hold: fields in any order, unknown fields skipped, the last value of
a non-repeated scalar wins, a message field given twice is their merge (headers add up), the
last of a oneof's fields wins, a map's last entry for a key replaces the others. Bytes that
are not a ``ProcessingRequest`` (truncated, a group, a length past its message) raise
``WireError``.

Field numbers (envoy.service.ext_proc.v3, envoy.config.core.v3, google.protobuf.struct):

- ``ProcessingRequest``: request_headers 2, response_headers 3, request_body 4,
  response_body 5, request_trailers 6, response_trailers 7 (a oneof), metadata_context 8,
  attributes 9 (map<string, Struct>), protocol_config 11;
- ``HttpHeaders``: headers 1 (``HeaderMap``: headers 1; ``HeaderValue``: key 1, value 2,
  raw_value 3), end_of_stream 3; ``HttpBody``: body 1, end_of_stream 2;
- ``ProtocolConfiguration``: request_body_mode 1, response_body_mode 2,
  send_body_without_waiting_for_header_response 3;
- ``Metadata``: filter_metadata 1 (map<string, Struct>); ``Struct``: fields 1
  (map<string, Value>); ``Value``: string_value 3 (of a oneof); a map entry: key 1, value 2.
"""

from __future__ import annotations

# the kinds of ProcessingRequest (its oneof ``request``)
REQUEST_HEADERS, RESPONSE_HEADERS, REQUEST_BODY, RESPONSE_BODY = 2, 3, 4, 5
REQUEST_TRAILERS, RESPONSE_TRAILERS = 6, 7
_METADATA, _ATTRIBUTES, _PROTOCOL = 8, 9, 11
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """The bytes are not a well-formed ``ProcessingRequest``."""


def _varint(buf: bytes, i: int, end: int) -> tuple[int, int]:
    """The varint at ``i`` and the index after it."""
    value = shift = 0
    while i < end:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            break
    raise WireError("a varint runs past its message or over 10 bytes")


def field(buf: bytes, i: int, end: int) -> tuple[int, int, int]:
    """The field at ``i`` of a message ending at ``end``: (tag, a, b). A length-delimited
    field's bytes are ``buf[a:b]``; a varint's value is ``a``; in every case the next field
    starts at ``b``. Tags of fields 1 to 15 and lengths under 128 take one byte."""
    try:
        tag = buf[i]
        if tag < 0x80:
            i += 1
        else:
            tag, i = _varint(buf, i, end)
        if tag < 8 or i >= end:
            raise WireError("field number 0, or a field past its message")
        wire = tag & 7
        if wire == _LENGTH:
            n = buf[i]
            if n < 0x80:
                i += 1
            else:
                n, i = _varint(buf, i, end)
        elif wire == _VARINT:
            n = buf[i]
            if n < 0x80:
                return tag, n, i + 1
            n, i = _varint(buf, i, end)
            return tag, n, i
        elif wire == _FIXED64 or wire == _FIXED32:
            n = 8 if wire == _FIXED64 else 4
        else:
            raise WireError(f"wire type {wire} (a group: ext_proc has none)")
    except IndexError:
        raise WireError("the message ends inside a field") from None
    if i + n > end:
        raise WireError("a field runs past its message")
    return tag, i, i + n


# tags: field number << 3 | wire type
_L1, _L2, _L3, _V1, _V2, _V3 = 0x0A, 0x12, 0x1A, 0x08, 0x10, 0x18


class Request:
    """A ``ProcessingRequest`` read from its bytes: ``kind``, which of its parts it carries
    (``REQUEST_HEADERS``..., 0 for none), that part's bytes ``part[at[0]:at[1]]``, and
    ``others``: its other length-delimited fields, (number, start, stop)."""

    __slots__ = ("buf", "part", "kind", "at", "others")

    def __init__(self, buf: bytes):
        self.buf = self.part = buf
        kind, at, others = 0, (0, 0), []
        i, end = 0, len(buf)
        while i < end:
            tag, a, i = field(buf, i, end)
            if tag & 7 != _LENGTH:
                continue                    # observability_mode
            number = tag >> 3
            if REQUEST_HEADERS <= number <= RESPONSE_TRAILERS:
                if number == kind:          # a message field given twice is their merge
                    self.part = self.part[at[0]:at[1]] + buf[a:i]
                    at = (0, len(self.part))
                else:                       # a oneof: the last one set wins
                    self.part = buf
                    kind, at = number, (a, i)
            else:
                others.append((number, a, i))
        self.kind, self.at, self.others = kind, at, others

    def headers(self, kept: frozenset[bytes]) -> tuple[dict[str, str], bool]:
        """The headers of an ``HttpHeaders`` part whose names are in ``kept`` (lower case,
        as Envoy sends them; a name given twice: its last value), and end_of_stream."""
        buf, (i, end) = self.part, self.at
        out: dict[str, str] = {}
        eos = False
        while i < end:
            tag, a, i = field(buf, i, end)
            if tag == _V3:                                      # end_of_stream
                eos = a != 0
            elif tag == _L1:                                    # headers: a HeaderMap
                while a < i:
                    tag, b, a = field(buf, a, i)
                    if tag != _L1:
                        continue
                    key = value = raw = None                    # a HeaderValue
                    while b < a:
                        tag, c, b = field(buf, b, a)
                        if tag == _L1:
                            key = buf[c:b]
                        elif tag == _L3:
                            raw = buf[c:b]
                        elif tag == _L2:
                            value = buf[c:b]
                    if key in kept:
                        out[key.decode("latin-1")] = (
                            raw.decode("latin-1") if raw else
                            value.decode("utf-8", "replace") if value else "")
        return out, eos

    def body(self) -> tuple[bytes, bool]:
        """An ``HttpBody`` part's bytes and end_of_stream."""
        buf, (i, end) = self.part, self.at
        body, eos = b"", False
        while i < end:
            tag, a, i = field(buf, i, end)
            if tag == _L1:
                body = buf[a:i]
            elif tag == _V2:
                eos = a != 0
        return body, eos

    def modes(self) -> tuple[int, int, bool] | None:
        """``protocol_config``: request_body_mode, response_body_mode,
        send_body_without_waiting_for_header_response; None without one."""
        found = False
        request = response = 0
        early = False
        buf = self.buf
        for number, i, end in self.others:
            if number != _PROTOCOL:
                continue
            found = True
            while i < end:
                tag, a, i = field(buf, i, end)
                if tag == _V1:
                    request = a
                elif tag == _V2:
                    response = a
                elif tag == _V3:
                    early = a != 0
        return (request, response, early) if found else None

    def attribute(self, namespace: bytes, key: bytes) -> str | None:
        """The string value of ``attributes[namespace].fields[key]`` (None when missing,
        empty or not a string)."""
        found = None
        for number, i, end in self.others:
            if number == _ATTRIBUTES:
                found = _in_entry(self.buf, i, end, namespace, key, found)
        return found.decode("utf-8", "replace") if found else None

    def filter_metadata(self, namespace: bytes, key: bytes) -> str | None:
        """The string value of ``metadata_context.filter_metadata[namespace].fields[key]``."""
        buf, found = self.buf, None
        for number, i, end in self.others:
            if number == _METADATA:
                while i < end:
                    tag, a, i = field(buf, i, end)
                    if tag == _L1:                              # filter_metadata
                        found = _in_entry(buf, a, i, namespace, key, found)
        return found.decode("utf-8", "replace") if found else None


def _in_entry(buf: bytes, i: int, end: int, namespace: bytes, key: bytes,
              found: bytes | None) -> bytes | None:
    """``found`` after the map<string, Struct> entry ``buf[i:end]``: when the entry is
    named ``namespace`` (a map's last entry for a key replaces the others), the string
    value of its Struct's last field named ``key``, else None."""
    name, (i, end) = _entry(buf, i, end)
    if name != namespace:
        return found
    found = None
    while i < end:                                              # Struct
        tag, a, i = field(buf, i, end)
        if tag != _L1:                                          # fields: an entry
            continue
        fname, (b, stop) = _entry(buf, a, i)
        if fname == key:
            found = None
            while b < stop:                                     # a Value (a oneof:
                tag, c, b = field(buf, b, stop)                 # the last one set)
                found = buf[c:b] if tag == _L3 else None        # string_value
    return found


def _entry(buf: bytes, i: int, end: int) -> tuple[bytes, tuple[int, int]]:
    """A map entry ``buf[i:end]``: its key and its value's span (empty when it has none)."""
    key, value = b"", (0, 0)
    while i < end:
        tag, a, i = field(buf, i, end)
        if tag == _L1:
            key = buf[a:i]
        elif tag == _L2:
            value = (a, i)
    return key, value
