"""The picker's reading of ProcessingRequest bytes (engine_advisor.service.epp.wire) against
protobuf's own decoding of the same bytes, on random messages shaped like Envoy's and on
bytes that are not messages."""

from __future__ import annotations

import random

import grpc
import pytest
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc import AUTH, SHORT, body_parts, headers, raw_of
from google.protobuf.message import DecodeError

from engine_advisor.service.epp import wire

KINDS = ("request_headers", "response_headers", "request_body", "response_body",
         "request_trailers", "response_trailers")
NUMBER = {k: i + 2 for i, k in enumerate(KINDS)}
NAMES = [":method", ":path", ":status", "authorization", "retry-after", "content-type", "x"]
KEPT = frozenset(n.encode() for n in (":method", ":path", ":status", "authorization",
                                      "retry-after"))
NAMESPACES = ["envoy.filters.http.ext_proc", "envoy.lb", "other"]
KEYS = ["upstream.address", "x-gateway-destination-endpoint-served", "request.path"]


def _text(rng: random.Random, longest: int) -> str:
    return "".join(rng.choice("ab:/.-_0123456789é") for _ in range(rng.randrange(longest)))


def _struct(rng: random.Random, struct) -> None:
    for _ in range(rng.randrange(3)):
        value = struct.fields[rng.choice(KEYS)]
        pick = rng.randrange(4)
        if pick == 0:
            value.number_value = rng.random()
        elif pick == 1:
            value.bool_value = True
        else:
            value.string_value = _text(rng, 40)


def random_request(rng: random.Random) -> pb.ProcessingRequest:
    req = pb.ProcessingRequest()
    kind = rng.choice(KINDS)
    part = getattr(req, kind)
    if kind.endswith("headers") or kind.endswith("trailers"):
        target = part.headers if kind.endswith("headers") else part.trailers
        for _ in range(rng.randrange(6)):
            name = rng.choice(NAMES)
            text = _text(rng, 300)                 # lengths past 127: two-byte varints
            target.headers.append(HeaderValue(key=name, raw_value=text.encode())
                                  if rng.random() < 0.7 else HeaderValue(key=name, value=text))
        if kind.endswith("headers"):
            part.end_of_stream = rng.random() < 0.5
        else:
            part.SetInParent()
    else:
        part.body = rng.randbytes(rng.choice((0, 5, 200, 70_000)))
        part.end_of_stream = rng.random() < 0.5
    for _ in range(rng.randrange(3)):
        _struct(rng, req.attributes[rng.choice(NAMESPACES)])
    if rng.random() < 0.3:
        _struct(rng, req.metadata_context.filter_metadata[rng.choice(NAMESPACES)])
    if rng.random() < 0.4:
        pc = req.protocol_config
        pc.request_body_mode = rng.randrange(5)
        pc.response_body_mode = rng.randrange(5)
        pc.send_body_without_waiting_for_header_response = rng.random() < 0.5
    if rng.random() < 0.2:
        req.observability_mode = True
    return req


def _string(structs, namespace: str, key: str) -> str | None:
    if namespace not in structs or key not in structs[namespace].fields:
        return None
    value = structs[namespace].fields[key]
    return (value.string_value or None) if value.WhichOneof("kind") == "string_value" else None


def expected(req: pb.ProcessingRequest) -> dict:
    """What the picker reads, as protobuf's decoding of the same bytes gives it."""
    kind = req.WhichOneof("request")
    out = {"kind": NUMBER.get(kind, 0),
           "modes": ((req.protocol_config.request_body_mode,
                      req.protocol_config.response_body_mode,
                      req.protocol_config.send_body_without_waiting_for_header_response)
                     if req.HasField("protocol_config") else None)}
    for ns in NAMESPACES:
        for key in KEYS:
            out["attribute", ns, key] = _string(req.attributes, ns, key)
            out["metadata", ns, key] = _string(req.metadata_context.filter_metadata, ns, key)
    if kind in ("request_headers", "response_headers"):
        part = getattr(req, kind)
        hs = {h.key: h.raw_value.decode("latin-1") if h.raw_value else h.value
              for h in part.headers.headers if h.key.encode() in KEPT}
        out["headers"] = (hs, part.end_of_stream)
    elif kind in ("request_body", "response_body"):
        part = getattr(req, kind)
        out["body"] = (part.body, part.end_of_stream)
    return out


def read(buf: bytes) -> dict:
    r = wire.Request(buf)
    out = {"kind": r.kind, "modes": r.modes()}
    for ns in NAMESPACES:
        for key in KEYS:
            out["attribute", ns, key] = r.attribute(ns.encode(), key.encode())
            out["metadata", ns, key] = r.filter_metadata(ns.encode(), key.encode())
    if r.kind in (wire.REQUEST_HEADERS, wire.RESPONSE_HEADERS):
        out["headers"] = r.headers(KEPT)
    elif r.kind in (wire.REQUEST_BODY, wire.RESPONSE_BODY):
        out["body"] = r.body()
    return out


@pytest.mark.parametrize("seed", range(8))
def test_random_messages_read_as_protobuf_decodes_them(seed):
    rng = random.Random(seed)
    for _ in range(150):
        req = random_request(rng)
        buf = req.SerializeToString()
        assert read(buf) == expected(req)


@pytest.mark.parametrize("seed", range(4))
def test_concatenated_messages_read_as_their_merge(seed):
    """Protobuf decodes two messages' bytes one after the other as their merge: a part given
    twice adds its headers up, the last scalar and oneof win, a map's last entry wins."""
    rng = random.Random(100 + seed)
    for _ in range(150):
        buf = random_request(rng).SerializeToString() + random_request(rng).SerializeToString()
        assert read(buf) == expected(pb.ProcessingRequest.FromString(buf))


def test_the_messages_of_the_test_gateway_read_as_sent():
    for req in [headers(mode=2, authorization="Bearer k"), *body_parts(raw_of(SHORT), 16)]:
        assert read(req.SerializeToString()) == expected(req)
    resp = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=HeaderMap(headers=[
        HeaderValue(key=":status", raw_value=b"503"),
        HeaderValue(key="retry-after", raw_value=b"3")]), end_of_stream=True))
    resp.attributes["envoy.filters.http.ext_proc"].update({"upstream.address": "10.0.0.7:80"})
    r = wire.Request(resp.SerializeToString())
    assert r.headers(KEPT) == ({":status": "503", "retry-after": "3"}, True)
    assert r.attribute(b"envoy.filters.http.ext_proc", b"upstream.address") == "10.0.0.7:80"


def test_truncated_messages_are_refused_where_protobuf_refuses_them():
    rng = random.Random(7)
    for _ in range(60):
        buf = random_request(rng).SerializeToString()
        for cut in sorted({rng.randrange(len(buf)) for _ in range(10)} if buf else ()):
            part = buf[:cut]
            try:
                pb.ProcessingRequest.FromString(part)
                refused = False
            except DecodeError:
                refused = True
            if refused:     # the cut fell inside a top-level field
                with pytest.raises(wire.WireError):
                    wire.Request(part)
            else:
                wire.Request(part)


def test_bytes_that_are_no_message_raise_only_wire_errors():
    rng = random.Random(11)
    samples = [rng.randbytes(rng.randrange(1, 64)) for _ in range(3000)]
    samples += [b"\x12\x05\x0a\x03\x0a\x01", b"\x12\x80", b"\x13", b"\x00", b"\x12\x02\x0a\x7f",
                b"\x4a\x04\x0a\x02ab", b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"]
    refused = 0
    for buf in samples:
        try:
            read(buf)
        except wire.WireError:
            refused += 1
    assert refused > len(samples) // 2


def test_a_stream_of_bytes_that_are_no_message_is_ended_with_invalid_argument(picker):
    app, _, _ = picker()
    call = app.state.epp_channel.stream_stream(
        "/envoy.service.ext_proc.v3.ExternalProcessor/Process")
    with pytest.raises(grpc.RpcError) as exc:
        list(call(iter([b"\x12\x80"]), timeout=10, metadata=AUTH))
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not an ext_proc ProcessingRequest" in exc.value.details()


def _ld(number: int, payload: bytes) -> bytes:
    """A length-delimited field (lengths under 128)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


@pytest.mark.parametrize("values, served", [
    (("string_value", "10.0.0.1:80"), "10.0.0.1:80"),
    (("string_value", "10.0.0.1:80", "number_value", 1.0), None),    # a oneof: the last
    (("number_value", 1.0, "string_value", "10.0.0.2:80"), "10.0.0.2:80"),
])
def test_a_value_set_twice_reads_as_its_last_kind(values, served):
    from google.protobuf.struct_pb2 import Value

    value = b"".join(Value(**{values[i]: values[i + 1]}).SerializeToString()
                     for i in range(0, len(values), 2))
    struct = _ld(1, _ld(1, b"upstream.address") + _ld(2, value))
    buf = _ld(9, _ld(1, b"envoy.filters.http.ext_proc") + _ld(2, struct))
    assert _string(pb.ProcessingRequest.FromString(buf).attributes,
                   "envoy.filters.http.ext_proc", "upstream.address") == served
    assert wire.Request(buf).attribute(b"envoy.filters.http.ext_proc",
                                       b"upstream.address") == served
