"""ext_proc messages the way Envoy sends them, and readers of the picker's answers (shared by
the in-process picker tests). The ``picker`` fixture (conftest.py) starts the app."""

from __future__ import annotations

import json
import queue

from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

POOLS = {
    "pools": {"vllm": [{"name": "va", "url": "http://127.0.0.1:1", "model": "m"},
                       {"name": "vb", "url": "http://127.0.0.1:2", "model": "m"}],
              "sglang": [{"name": "sa", "url": "http://127.0.0.1:3/v1", "model": "m",
                          "dcp_size": 8, "api_key": "engine-key"}]},
    "workload": {"kv_bytes_per_token": 70272, "batch_size": 64},
    "tokens": {"upstream_tokenize": False},
    # unreachable upstreams stay "healthy": no check fails them during a test
    "health": {"interval_s": 600, "failure_threshold": 100},
}
TOKEN = "gateway-secret-3f9a"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
SHORT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}
LONG = {"model": "m", "prompt": [7] * 200_000, "max_tokens": 2048}     # token ids: exact
BUFFERED = ProcessingMode.BUFFERED
STREAMED = ProcessingMode.STREAMED
DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED


class Gateway:
    """The stub as the gateway calls it: with its token in the stream's metadata."""

    def __init__(self, stub, metadata=AUTH):
        self.stub, self.metadata = stub, metadata

    def Process(self, requests, timeout):  # noqa: N802 (the gRPC method name)
        return self.stub.Process(requests, timeout=timeout, metadata=self.metadata)


def headers(method="POST", path="/v1/chat/completions", end=False, mode=None,
            nowait=True, **extra) -> pb.ProcessingRequest:
    """Request headers; ``mode``: the request body mode the first message's
    ``protocol_config`` announces (None: no protocol_config, as older gateways)."""
    hs = [(":method", method), (":path", path), ("content-type", "application/json"),
          *extra.items()]
    req = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=HeaderMap(headers=[
        HeaderValue(key=k, raw_value=v.encode()) for k, v in hs]), end_of_stream=end))
    if mode is not None:
        req.protocol_config.request_body_mode = mode
        req.protocol_config.send_body_without_waiting_for_header_response = nowait
    return req


def body_parts(raw: bytes, size: int = 16 << 10) -> list[pb.ProcessingRequest]:
    parts = [raw[i:i + size] for i in range(0, len(raw), size)]
    return [pb.ProcessingRequest(request_body=pb.HttpBody(body=p, end_of_stream=i == len(
        parts) - 1)) for i, p in enumerate(parts)]


def buffered(raw: bytes) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True))


def response_headers(status: int, served: str | None, **extra) -> pb.ProcessingRequest:
    req = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=HeaderMap(headers=[
        HeaderValue(key=k, raw_value=v.encode())
        for k, v in ((":status", str(status)), *extra.items())])))
    if served is not None:
        req.attributes["envoy.filters.http.ext_proc"].update({"upstream.address": served})
    return req


def raw_of(body: dict | bytes) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


def exchange(stub, body: dict | bytes, path="/v1/chat/completions", mode=None, **hdrs):
    """One request's messages (headers, then the body: one message in BUFFERED mode, 16 KiB
    chunks otherwise) and the picker's answers."""
    raw = raw_of(body)
    parts = [buffered(raw)] if mode == BUFFERED else body_parts(raw)
    return list(stub.Process(iter([headers(path=path, mode=mode, **hdrs), *parts]),
                             timeout=30))


def open_stream(stub, mode=None, body: dict | None = None):
    """A live Process stream that has sent a short request's headers and body: (the queue
    that feeds it, its responses)."""
    sent: queue.Queue = queue.Queue()
    responses = stub.Process(iter(sent.get, None), timeout=30)
    sent.put(headers(mode=mode))
    raw = raw_of(body or SHORT)
    for part in ([buffered(raw)] if mode == BUFFERED else body_parts(raw)):
        sent.put(part)
    return sent, responses


def set_headers(common) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode()
            for h in common.header_mutation.set_headers}


def mutation(resp: pb.ProcessingResponse) -> dict[str, str]:
    """The request header mutation of a decision (headers or buffered body answer)."""
    kind = resp.WhichOneof("response")
    return set_headers(getattr(resp, kind).response)


def error_of(out) -> tuple[int, dict, dict]:
    """An exchange that ended in an immediate response (after, in BUFFERED mode, the
    headers' CONTINUE): its status, error envelope and headers."""
    *before, last = out
    assert last.WhichOneof("response") == "immediate_response", out
    assert all(o.WhichOneof("response") == "request_headers"
               and not o.request_headers.HasField("response") for o in before), out
    im = last.immediate_response
    hs = {h.header.key: h.header.raw_value.decode() for h in im.headers.set_headers}
    return im.status.code, json.loads(im.body)["error"], hs


def upstream(app, name: str):
    return next(u for u in app.state.proxy.pools.upstreams if u.name == name)


def in_flight(app) -> dict[str, int]:
    return {u.name: u.in_flight for u in app.state.proxy.pools.upstreams}
