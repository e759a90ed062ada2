"""One ext_proc stream: one HTTP request through the gateway, message by message.

The gateway says in its first message (``protocol_config``) how it sends the request body;
the picker needs the whole body before the request headers go on, which three modes allow:

- ``BUFFERED`` (the shipped ``deploy/gateway/envoy.yaml``): the headers are answered at once
  (CONTINUE); the body comes in one message, whose answer carries the decision (Envoy applies
  header mutations of a buffered body's answer). Two round trips, no body sent back.
- ``STREAMED`` with ``send_body_without_waiting_for_header_response``: the headers' answer
  waits for the body's last chunk and carries the decision; each chunk is then answered
  CONTINUE. One round trip, no body sent back, one message per chunk.
- ``FULL_DUPLEX_STREAMED`` (what Gateway API Inference Extension gateways send; assumed when
  the first message has no ``protocol_config``): as STREAMED, but the picker sends the body
  back, in chunks of at most 60 KiB.

Any other request body mode gets a 500 naming the setting.

- request headers: only ``:method``, ``:path`` and ``authorization`` are kept. A request
  without a body, or not ``POST /v1/chat/completions`` / ``/v1/completions``, is not routed
  (answered at once, its body passed on): the gateway's ``override_host`` fallback chooses.
- request body: gathered up to the proxy's body cap (413 past it), then decided
  (``decision.pick_endpoints``; without waiting unless a prompt count or the endpoints'
  resolution is needed): the destination header, ``envoy.lb`` metadata,
  ``clear_route_cache``, ``x-engine-advisor-engine`` / ``-upstream``. An error is an
  immediate response with the service's error envelope (400, 401, 404, 413, 429, 503; 500
  for a failure of the picker itself, whose details go to the log only).
- response headers (when the gateway sends them): the endpoint that served (the
  ``upstream.address`` attribute, else ``envoy.lb`` metadata
  ``x-gateway-destination-endpoint-served``) and its status go to the breakers, the
  in-flight count moves to that endpoint, and the client gets ``x-engine-advisor-engine``
  / ``-upstream`` of the upstream that served.
- response body / trailers: passed on (echoed in FULL_DUPLEX_STREAMED).

The request's in-flight count ends with the response: at the response's end of stream or
trailers when the gateway sends them, else when the gateway closes the ext_proc stream (Envoy
keeps it open until the HTTP request ends while ``response_trailer_mode`` is SEND), or after
the idle timeout (``idle()``), whichever comes first.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode

from engine_advisor.service.epp import decision, messages, wire
from engine_advisor.service.epp.endpoints import Endpoints
from engine_advisor.service.errors import ApiError

log = logging.getLogger("engine_advisor.epp")

FILTER = "envoy.filters.http.ext_proc"
BUFFERED = ProcessingMode.BUFFERED
STREAMED = ProcessingMode.STREAMED
DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
MODE_ERROR = ("the endpoint picker needs the whole request body before the headers go on: "
              "set the gateway's ext_proc processing_mode.request_body_mode BUFFERED, or "
              "FULL_DUPLEX_STREAMED, or STREAMED with "
              "send_body_without_waiting_for_header_response: true")
INTERNAL = "internal error; see the server log"
ANSWERS_KEPT = 4096
KEPT = frozenset({b":method", b":path", b"authorization"})        # of the request
STATUS = frozenset({b":status", b"retry-after"})                   # of the response
ADDRESS = (FILTER.encode(), b"upstream.address")                 # the attribute, and
SERVED = (messages.LB_NAMESPACE.encode(), messages.SERVED.encode())  # the metadata, naming
Answer = bytes                        # a serialized ProcessingResponse
NOTHING: tuple[Answer, ...] = ()
HEADERS_CONTINUE = (messages.HEADERS_CONTINUE,)
BODY_CONTINUE = (messages.BODY_CONTINUE,)
REQUEST_TRAILERS = (messages.REQUEST_TRAILERS,)


def served_endpoint(req: wire.Request) -> str | None:
    """The endpoint that served: the ``upstream.address`` attribute (what the shipped
    configuration asks Envoy for), else the ``envoy.lb`` metadata
    ``x-gateway-destination-endpoint-served`` (the Endpoint Picker Protocol's report)."""
    return req.attribute(*ADDRESS) or req.filter_metadata(*SERVED)


def _status(value: str | None) -> int:
    """``:status`` as a number, 0 when missing or not a number."""
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


class Answers:
    """Serialized answers that depend only on the upstreams they name (a decision's headers,
    a response's ``x-engine-advisor-*``), per ``stamp`` (the pools generation and the
    endpoints' resolution): built once, sent many times. ``get`` gives a saved one (None
    when it must be built), ``put`` saves one."""

    def __init__(self, kept: int = ANSWERS_KEPT):
        self.kept = kept
        self.stamp: tuple | None = None
        self.saved: dict[tuple, bytes] = {}

    def get(self, stamp: tuple, key: tuple) -> bytes | None:
        if stamp != self.stamp or len(self.saved) >= self.kept:
            self.stamp, self.saved = stamp, {}
        return self.saved.get(key)

    def put(self, key: tuple, answer: bytes) -> bytes:
        self.saved[key] = answer
        return answer


class Exchange:
    """The state of one stream; ``on(message)`` gives the answers to send, in order (or
    None, then ``await decide()`` gives them)."""

    __slots__ = ("state", "loaded", "endpoints", "answers", "counts", "last", "started",
                 "body_mode", "response_duplex", "headers", "path", "chunks", "size",
                 "closed", "trailers", "listed", "stamp", "holding", "probe", "pending")

    def __init__(self, state, loaded, endpoints: Endpoints, answers: Answers, counts):
        self.state, self.loaded, self.endpoints = state, loaded, endpoints
        self.answers, self.counts = answers, counts     # counts: engine_advisor.service.epp.shared
        self.last = 0.0              # when its last message came (the idle timeout's clock)
        self.started = False         # its first message (the only one with protocol_config)
        self.body_mode = DUPLEX
        self.response_duplex = True
        self.headers: dict[str, str] = {}
        self.path: str | None = None  # a routed request's path, while its body is coming
        self.chunks: list[bytes] = []
        self.size = 0
        self.closed = False          # an immediate response ended the exchange
        self.trailers = False        # the body ended with the request trailers
        self.listed: list = []       # the decision's upstreams, primary first
        self.stamp: tuple | None = None   # the decision's ``_stamp()``
        self.holding = None          # the upstream whose in-flight count this request holds
        self.probe = False           # ... as its half-open breaker's probe, not yet reported
        self.pending = None          # the decision's coroutine when it waits (``decide()``)

    def on(self, raw: bytes) -> Sequence[Answer] | None:
        """The answers to the ``ProcessingRequest`` ``raw`` (its bytes), in order; None when
        they are the decision's (``decide()``: the body of a routed request is complete).
        Raises ``wire.WireError`` for bytes that are not a ProcessingRequest."""
        req = wire.Request(raw)
        if not self.started:
            self.started = True
            modes = req.modes()
            if modes is not None:
                mode, response, early = modes
                if mode not in (BUFFERED, DUPLEX) and not (mode == STREAMED and early):
                    return self._error(ApiError(500, MODE_ERROR))
                self.body_mode = mode
                self.response_duplex = response == DUPLEX
        kind = req.kind
        if kind == wire.REQUEST_BODY:
            return self._request_body(req)
        if kind == wire.REQUEST_HEADERS:
            return self._request_headers(req)
        if kind == wire.RESPONSE_HEADERS:
            return self._response_headers(req)
        if kind == wire.RESPONSE_BODY:
            body, end = req.body()
            if end:
                self.finish()
            return (messages.streamed(body, end, True) if self.response_duplex
                    else messages.RESPONSE_BODY_CONTINUE,)
        if kind == wire.REQUEST_TRAILERS:    # the body's end when it ends without end_of_stream
            if self.path is None:
                return REQUEST_TRAILERS
            self.trailers = True
            return self._complete()
        if kind == wire.RESPONSE_TRAILERS:
            self.finish()
            return (messages.RESPONSE_TRAILERS,)
        return NOTHING

    async def decide(self) -> Sequence[Answer]:
        """The answers that ``on`` left to the decision (it waits for a prompt count or the
        endpoints' resolution)."""
        pending, self.pending = self.pending, None
        return self._ended(await pending)

    def _ended(self, out: Sequence[Answer]) -> Sequence[Answer]:
        return (*out, messages.REQUEST_TRAILERS) if self.trailers and not self.closed else out

    # ------------------------------------------------------------------ request
    def _request_headers(self, req: wire.Request) -> Sequence[Answer]:
        headers, end = req.headers(KEPT)
        self.headers = headers
        if not end and headers.get(":method") == "POST":
            path = headers.get(":path", "").split("?", 1)[0]
            if path in decision.ROUTED_PATHS:
                self.path = path
                if self.body_mode != BUFFERED:
                    return NOTHING           # answered with the decision, at the body's end
        return HEADERS_CONTINUE

    def _request_body(self, req: wire.Request) -> Sequence[Answer] | None:
        chunk, end = req.body()
        if self.path is None:
            return ((messages.streamed(chunk, end, False),) if self.body_mode == DUPLEX
                    else BODY_CONTINUE)
        self.chunks.append(chunk)
        self.size += len(chunk)
        cap = decision.body_cap(self.state)
        if self.size > cap:
            return self._error(ApiError(413, f"request body: larger than {cap} bytes"))
        if end or self.body_mode == BUFFERED:   # BUFFERED: all of it, at once
            return self._complete()
        return NOTHING

    def _complete(self) -> Sequence[Answer] | None:
        """The body is complete: the decision's answers, or None when it waits (``pending``,
        for ``decide()``)."""
        chunks, path = self.chunks, self.path
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.chunks, self.path = [], None
        try:
            picked = decision.pick_endpoints(self.state, self.loaded, path, raw,
                                             self.headers, self.counts)
            generation = decision.generation(self.state)
            if type(picked) is not decision.Picked or not self.endpoints.fresh(generation):
                self.pending = self._wait(picked, generation, raw, len(chunks))
                return None
            return self._ended(self._route(picked, generation, raw, len(chunks)))
        except Exception as exc:
            return self._failed(exc)

    async def _wait(self, picked, generation, raw: bytes, chunks: int) -> Sequence[Answer]:
        try:
            if type(picked) is not decision.Picked:
                picked = await picked
            endpoints = self.endpoints
            if not endpoints.fresh(generation):
                await endpoints.refresh(generation, decision.upstreams(self.state))
            return self._route(picked, generation, raw, chunks)
        except Exception as exc:
            return self._failed(exc)

    def _failed(self, exc: Exception) -> Sequence[Answer]:
        """The answer to a decision that raised (called in its ``except``): its ``ApiError``,
        else a 500 for a failure of the picker, whose details go to the log only."""
        if isinstance(exc, ApiError):
            return self._error(exc)
        log.exception("endpoint picker: the decision failed")
        return self._error(ApiError(500, INTERNAL))

    def _route(self, picked: decision.Picked, generation, raw: bytes,
               chunks: int) -> Sequence[Answer]:
        """The answers that route the request to ``picked``'s upstreams."""
        endpoints = self.endpoints
        listed = self.listed = endpoints.listed(picked.upstreams, generation)
        if not listed:
            raise ApiError(503, "no upstream has an address the gateway can use: "
                           + ", ".join(f"{u.name} ({u.url})" for u in picked.upstreams))
        self._hold(listed[0])
        mode = self.body_mode
        in_body = mode == BUFFERED
        drop = "authorization" in self.headers
        self.stamp = stamp = (generation, endpoints.version)
        key = (in_body, drop, *map(id, listed))
        first = self.answers.get(stamp, key) or self.answers.put(
            key, self._decided(in_body, drop))
        if in_body:
            return (first,)
        if mode == STREAMED:
            return (first, *BODY_CONTINUE * chunks)
        return (first, *messages.body_chunks(raw))

    def _decided(self, in_body: bool, drop: bool) -> bytes:
        primary = self.listed[0]
        set_ = {"x-engine-advisor-engine": primary.engine,
                "x-engine-advisor-upstream": primary.name}
        remove = []
        if primary.spec.api_key is not None:
            set_["authorization"] = f"Bearer {primary.spec.api_key.get_secret_value()}"
        elif drop:
            remove.append("authorization")     # the client's key stays with the gateway
        dest = ",".join(self.endpoints.endpoint(u) for u in self.listed)
        return messages.decided(in_body, set_, remove, dest)

    def _error(self, exc: ApiError) -> Sequence[Answer]:
        self.closed = True
        return (messages.immediate(exc.status, exc.detail().model_dump(), exc.headers),)

    # ------------------------------------------------------------------ response
    def _response_headers(self, req: wire.Request) -> Sequence[Answer]:
        headers, end = req.headers(STATUS)
        out = (self._reported(req, headers),)
        if end:
            self.finish()
        return out

    def _reported(self, req: wire.Request, headers: dict[str, str]) -> Answer:
        """The gateway's report of the response (its ``headers``: ``STATUS``)."""
        ep = served_endpoint(req)
        listed = self.listed
        if ep is not None:
            up = self.endpoints.upstream(ep)
        else:                            # the gateway does not say: assume the primary
            up = listed[0] if listed else None
        if listed:
            wait = headers.get("retry-after")
            decision.served(self.state, listed, up, _status(headers.get(":status")),
                            _retry_after(wait) if wait else None)
            if up is not None:
                self.probe = False             # the report settled the probe's breaker
        if up is None:
            return messages.RESPONSE_HEADERS_CONTINUE
        if up is not self.holding:
            self._hold(up)
        key = ("served", id(up))
        return self.answers.get(self.stamp or self._stamp(), key) or self.answers.put(
            key, messages.response_headers({"x-engine-advisor-engine": up.engine,
                                            "x-engine-advisor-upstream": up.name}))

    def _stamp(self) -> tuple:
        """What the answers cached for upstreams depend on besides them: the pools generation
        and the endpoints' resolution."""
        return decision.generation(self.state), self.endpoints.version

    # ------------------------------------------------------------------ in flight
    def _hold(self, up) -> None:
        if self.holding is not None:
            self.finish()
        self.probe = decision.sent(self.state, up, self.counts)
        self.holding = up

    def finish(self) -> None:
        """The request ended (or its stream went idle): its in-flight count ends."""
        if self.holding is not None:
            decision.done(self.state, self.holding, self.probe, self.counts)
            self.holding = None
            self.probe = False
