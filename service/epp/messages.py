"""ext_proc v3 responses the picker sends (builders and constants, no state).

Every answer is a serialized ``ProcessingResponse`` (bytes: the server sends them as they
are); the constant answers are serialized once, here.
"""

from __future__ import annotations

import json

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    ImmediateResponse,
    ProcessingResponse,
    StreamedBodyResponse,
    TrailersResponse,
)
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.protobuf.struct_pb2 import Struct

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"
# Envoy's buffers take 64 KiB per streamed chunk; stay under it.
CHUNK = 60 << 10

# Answers that change nothing (CONTINUE), one per kind of message.
HEADERS_CONTINUE = ProcessingResponse(request_headers=HeadersResponse()).SerializeToString()
BODY_CONTINUE = ProcessingResponse(request_body=BodyResponse()).SerializeToString()
RESPONSE_HEADERS_CONTINUE = ProcessingResponse(
    response_headers=HeadersResponse()).SerializeToString()
RESPONSE_BODY_CONTINUE = ProcessingResponse(response_body=BodyResponse()).SerializeToString()
REQUEST_TRAILERS = ProcessingResponse(request_trailers=TrailersResponse()).SerializeToString()
RESPONSE_TRAILERS = ProcessingResponse(response_trailers=TrailersResponse()).SerializeToString()


def mutation(set_: dict[str, str] | None = None, remove: list[str] | None = None
             ) -> HeaderMutation:
    return HeaderMutation(
        set_headers=[HeaderValueOption(header=HeaderValue(key=k.lower(), raw_value=v.encode()),
                                       append_action=HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)
                     for k, v in (set_ or {}).items()],
        remove_headers=remove or [])


def decided(in_body: bool, set_: dict[str, str], remove: list[str], destination: str
            ) -> bytes:
    """The decision: the picked endpoints in the destination header and in dynamic metadata
    ``envoy.lb`` (the same value), the headers ``set_`` / ``remove``, and the route cache
    cleared. ``in_body``: the answer to the (BUFFERED) request body, whose header mutations
    Envoy applies as well; else the answer to the request headers."""
    meta = Struct()
    meta.update({LB_NAMESPACE: {DESTINATION: destination}})
    common = CommonResponse(header_mutation=mutation({**set_, DESTINATION: destination},
                                                     remove), clear_route_cache=True)
    if in_body:
        out = ProcessingResponse(request_body=BodyResponse(response=common),
                                 dynamic_metadata=meta)
    else:
        out = ProcessingResponse(request_headers=HeadersResponse(response=common),
                                 dynamic_metadata=meta)
    return out.SerializeToString()


def body_chunks(body: bytes, response: bool = False) -> list[bytes]:
    """``body`` back to Envoy in FULL_DUPLEX_STREAMED chunks of at most ``CHUNK`` bytes, the
    last one ending the stream."""
    pieces = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
    out = []
    for i, piece in enumerate(pieces):
        out.append(streamed(piece, i == len(pieces) - 1, response))
    return out


def streamed(body: bytes, end: bool, response: bool) -> bytes:
    common = CommonResponse(body_mutation=BodyMutation(
        streamed_response=StreamedBodyResponse(body=body, end_of_stream=end)))
    if response:
        return ProcessingResponse(response_body=BodyResponse(response=common)
                                  ).SerializeToString()
    return ProcessingResponse(request_body=BodyResponse(response=common)).SerializeToString()


def response_headers(set_: dict[str, str]) -> bytes:
    return ProcessingResponse(response_headers=HeadersResponse(
        response=CommonResponse(header_mutation=mutation(set_)))).SerializeToString()


def immediate(status: int, error: dict, headers: dict[str, str] | None = None) -> bytes:
    """Envoy answers the client itself: ``status`` with the service's error envelope."""
    return ProcessingResponse(immediate_response=ImmediateResponse(
        status=HttpStatus(code=status),
        headers=mutation({"content-type": "application/json", **(headers or {})}),
        body=json.dumps({"error": error}).encode(), details=f"engine_advisor_{status}")
    ).SerializeToString()
