"""One ext_proc stream: one HTTP request through the gateway, phase by phase.

- request headers: kept; a request without a body (GET /v1/models, ...) is not routed by the
  picker: the answer changes nothing and the gateway's ``override_host`` fallback policy
  chooses.
- request body (FULL_DUPLEX_STREAMED): gathered up to the proxy's body cap (413 past it);
  at its end, ``POST /v1/chat/completions`` and ``/v1/completions`` are decided
  (``decision.pick_endpoints``) and answered with the headers response (destination header,
  ``envoy.lb`` metadata, ``clear_route_cache``, ``x-engine-advisor-engine`` / ``-upstream``)
  followed by the body, unchanged, in chunks. An error is an immediate response with the
  service's error envelope (400, 401, 404, 413, 429, 503). A gateway that says (in the
  first message's ``protocol_config``) it sends the request body in another mode gets a 500
  naming the setting: the picker answers the headers only once it has the body.
- response headers: the endpoint that served (``envoy.lb`` metadata
  ``x-gateway-destination-endpoint-served``, else the ``upstream.address`` attribute) and its
  status go to the breakers; the in-flight count moves to that endpoint; the client gets
  ``x-engine-advisor-engine`` / ``-upstream`` of the upstream that served.
- response body / trailers: passed on; the end of the response (or of the stream, whichever
  comes first) ends the request's in-flight count.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    ProcessingRequest,
    ProcessingResponse,
)

from service.epp import decision, messages
from service.epp.endpoints import Endpoints
from service.errors import ApiError

FILTER = "envoy.filters.http.ext_proc"
DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
MODE_ERROR = ("the endpoint picker needs the gateway's ext_proc processing_mode."
              "request_body_mode FULL_DUPLEX_STREAMED")


def _headers(msg) -> dict[str, str]:
    return {h.key.lower(): (h.raw_value.decode("latin-1") if h.raw_value else h.value)
            for h in msg.headers.headers}


def served_endpoint(req: ProcessingRequest) -> str | None:
    lb = req.metadata_context.filter_metadata.get(messages.LB_NAMESPACE)
    if lb is not None and messages.SERVED in lb.fields:
        return lb.fields[messages.SERVED].string_value or None
    attrs = req.attributes.get(FILTER)
    if attrs is not None and "upstream.address" in attrs.fields:
        return attrs.fields["upstream.address"].string_value or None
    return None


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


class Exchange:
    def __init__(self, state, loaded, endpoints: Endpoints):
        self.state, self.loaded, self.endpoints = state, loaded, endpoints
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.response_duplex = True
        self.listed: list = []
        self.holding = None          # the upstream whose in-flight count this request holds

    async def run(self, requests: AsyncIterator[ProcessingRequest]
                  ) -> AsyncIterator[ProcessingResponse]:
        try:
            async for req in requests:
                kind = req.WhichOneof("request")
                if req.HasField("protocol_config"):
                    pc = req.protocol_config
                    self.response_duplex = pc.response_body_mode == DUPLEX
                    if pc.request_body_mode != DUPLEX:
                        yield self._error(ApiError(500, MODE_ERROR))
                        return
                if kind == "request_headers":
                    self.headers = _headers(req.request_headers)
                    if req.request_headers.end_of_stream:
                        yield messages.request_headers()
                elif kind == "request_body":
                    async for out in self._request_body(req.request_body):
                        yield out
                        if out.HasField("immediate_response"):
                            return
                elif kind == "request_trailers":
                    yield messages.trailers(response=False)
                elif kind == "response_headers":
                    out = self._response_headers(req)
                    if req.response_headers.end_of_stream:
                        self._finish()
                    yield out
                elif kind == "response_body":
                    b = req.response_body
                    if b.end_of_stream:
                        self._finish()
                    yield (messages.streamed(b.body, b.end_of_stream, True)
                           if self.response_duplex else messages.body_continue())
                elif kind == "response_trailers":
                    self._finish()
                    yield messages.trailers(response=True)
        finally:
            self._finish()

    # ------------------------------------------------------------------ request
    async def _request_body(self, b) -> AsyncIterator[ProcessingResponse]:
        self.body.append(b.body)
        self.size += len(b.body)
        cap = decision.body_cap(self.state)
        if self.size > cap:
            yield self._error(ApiError(413, f"request body: larger than {cap} bytes"))
            return
        if not b.end_of_stream:
            return
        raw = b"".join(self.body)
        self.body.clear()
        path = self.headers.get(":path", "").split("?", 1)[0]
        if self.headers.get(":method") == "POST" and path in decision.ROUTED_PATHS:
            try:
                first = await self._decide(path, raw)
            except ApiError as exc:
                yield self._error(exc)
                return
        else:
            first = messages.request_headers()
        yield first
        for out in messages.body_chunks(raw):
            yield out

    async def _decide(self, path: str, raw: bytes) -> ProcessingResponse:
        picked = await decision.pick_endpoints(self.state, self.loaded, path, raw,
                                               self.headers)
        await self.endpoints.refresh(decision.generation(self.state),
                                     decision.upstreams(self.state))
        self.listed = [u for u in picked.upstreams if self.endpoints.endpoint(u)]
        if not self.listed:
            raise ApiError(503, "no upstream has an address the gateway can use: "
                           + ", ".join(f"{u.name} ({u.url})" for u in picked.upstreams))
        primary = self.listed[0]
        self._hold(primary)
        set_ = {"x-engine-advisor-engine": primary.engine,
                "x-engine-advisor-upstream": primary.name}
        remove = []
        if primary.spec.api_key is not None:
            set_["authorization"] = f"Bearer {primary.spec.api_key.get_secret_value()}"
        elif "authorization" in self.headers:
            remove.append("authorization")     # the client's key stays with the gateway
        dest = ",".join(self.endpoints.endpoint(u) for u in self.listed)
        return messages.request_headers(set_, remove, dest)

    def _error(self, exc: ApiError) -> ProcessingResponse:
        return messages.immediate(exc.status, exc.detail().model_dump(), exc.headers)

    # ------------------------------------------------------------------ response
    def _response_headers(self, req: ProcessingRequest) -> ProcessingResponse:
        h = _headers(req.response_headers)
        ep = served_endpoint(req)
        up = self.endpoints.upstream(ep) if ep else None
        if up is None and self.listed and ep is None:
            up = self.listed[0]                # the gateway does not say: assume the primary
        try:
            status = int(h.get(":status", "0"))
        except ValueError:
            status = 0
        if self.listed:
            decision.served(self.state, self.listed, up, status,
                            _retry_after(h.get("retry-after")))
        if up is None:
            return messages.response_headers({})
        if up is not self.holding:
            self._hold(up)
        return messages.response_headers({"x-engine-advisor-engine": up.engine,
                                          "x-engine-advisor-upstream": up.name})

    # ------------------------------------------------------------------ in flight
    def _hold(self, up) -> None:
        self._finish()
        decision.sent(self.state, up)
        self.holding = up

    def _finish(self) -> None:
        if self.holding is not None:
            decision.done(self.state, self.holding)
            self.holding = None
