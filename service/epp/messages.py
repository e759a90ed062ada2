"""ext_proc v3 responses the picker sends (protobuf builders, no state)."""

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


def mutation(set_: dict[str, str] | None = None, remove: list[str] | None = None
             ) -> HeaderMutation:
    return HeaderMutation(
        set_headers=[HeaderValueOption(header=HeaderValue(key=k.lower(), raw_value=v.encode()),
                                       append_action=HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)
                     for k, v in (set_ or {}).items()],
        remove_headers=remove or [])


def request_headers(set_: dict[str, str] | None = None, remove: list[str] | None = None,
                    destination: str | None = None) -> ProcessingResponse:
    """The request-headers answer; with ``destination`` the picked endpoints go in the header
    and in dynamic metadata ``envoy.lb`` (the same value), and the route cache is cleared."""
    if destination is None:
        return ProcessingResponse(request_headers=HeadersResponse(
            response=CommonResponse(header_mutation=mutation(set_, remove))))
    meta = Struct()
    meta.update({LB_NAMESPACE: {DESTINATION: destination}})
    common = CommonResponse(header_mutation=mutation({**(set_ or {}), DESTINATION: destination},
                                                     remove), clear_route_cache=True)
    return ProcessingResponse(request_headers=HeadersResponse(response=common),
                              dynamic_metadata=meta)


def body_chunks(body: bytes, response: bool = False) -> list[ProcessingResponse]:
    """``body`` back to Envoy in FULL_DUPLEX_STREAMED chunks of at most ``CHUNK`` bytes, the
    last one ending the stream."""
    pieces = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
    out = []
    for i, piece in enumerate(pieces):
        out.append(streamed(piece, i == len(pieces) - 1, response))
    return out


def streamed(body: bytes, end: bool, response: bool) -> ProcessingResponse:
    common = CommonResponse(body_mutation=BodyMutation(
        streamed_response=StreamedBodyResponse(body=body, end_of_stream=end)))
    if response:
        return ProcessingResponse(response_body=BodyResponse(response=common))
    return ProcessingResponse(request_body=BodyResponse(response=common))


def body_continue() -> ProcessingResponse:
    """The answer to a response body chunk in STREAMED or BUFFERED mode: pass it on."""
    return ProcessingResponse(response_body=BodyResponse())


def response_headers(set_: dict[str, str]) -> ProcessingResponse:
    return ProcessingResponse(response_headers=HeadersResponse(
        response=CommonResponse(header_mutation=mutation(set_))))


def trailers(response: bool) -> ProcessingResponse:
    if response:
        return ProcessingResponse(response_trailers=TrailersResponse())
    return ProcessingResponse(request_trailers=TrailersResponse())


def immediate(status: int, error: dict, headers: dict[str, str] | None = None
              ) -> ProcessingResponse:
    """Envoy answers the client itself: ``status`` with the service's error envelope."""
    return ProcessingResponse(immediate_response=ImmediateResponse(
        status=HttpStatus(code=status),
        headers=mutation({"content-type": "application/json", **(headers or {})}),
        body=json.dumps({"error": error}).encode(), details=f"engine_advisor_{status}"))
