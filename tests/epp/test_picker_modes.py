"""The request body modes the picker takes (BUFFERED, STREAMED without waiting for the headers'
answer, FULL_DUPLEX_STREAMED), the end of a request's in-flight count when the gateway sends
no response messages (the stream's end, or the idle timeout), and a half-open breaker's probe
given back when no report settles it. In-process picker, ext_proc messages as Envoy sends
them; upstreams are unreachable addresses (nothing is proxied, only decided)."""

from __future__ import annotations

import json
import time

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc import (
    BUFFERED,
    DUPLEX,
    LONG,
    SHORT,
    STREAMED,
    body_parts,
    buffered,
    exchange,
    headers,
    in_flight,
    mutation,
    open_stream,
    raw_of,
    upstream,
)
from proc import wait_for

from engine_advisor.service.epp.messages import DESTINATION, LB_NAMESPACE


def kinds(out) -> list[str]:
    return [o.WhichOneof("response") for o in out]


def test_buffered_headers_pass_at_once_and_the_body_answer_carries_the_decision(picker):
    app, stub, http = picker()
    decided = http.post("/v1/route", json=LONG).json()
    out = exchange(stub, LONG, path="/v1/completions", mode=BUFFERED)
    assert kinds(out) == ["request_headers", "request_body"]
    assert not out[0].request_headers.HasField("response")        # CONTINUE, nothing set
    body = out[1].request_body.response
    assert not body.HasField("body_mutation")                     # the body is not sent back
    assert body.clear_route_cache
    set_ = mutation(out[1])
    assert set_["x-engine-advisor-upstream"] == decided["upstream"] == "sa"
    assert set_["authorization"] == "Bearer engine-key"
    meta = out[1].dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
    assert meta[DESTINATION].string_value == set_[DESTINATION] == \
        "127.0.0.1:3,127.0.0.1:1,127.0.0.1:2"


def test_streamed_headers_answer_waits_for_the_body_then_each_chunk_continues(picker):
    app, stub, http = picker()
    raw = raw_of({**SHORT, "messages": [{"role": "user", "content": "y" * 40_000}]})
    parts = body_parts(raw)                                       # 16 KiB chunks: 3
    out = list(stub.Process(iter([headers(mode=STREAMED), *parts]), timeout=30))
    assert kinds(out) == ["request_headers"] + ["request_body"] * len(parts)
    assert len(parts) == 3
    assert mutation(out[0])["x-engine-advisor-engine"] == http.post(
        "/v1/route", content=raw).json()["engine"]
    assert out[0].request_headers.response.clear_route_cache
    assert all(not o.request_body.HasField("response") for o in out[1:])   # CONTINUE


def test_streamed_without_send_body_without_waiting_is_refused(picker):
    app, stub, http = picker()
    out = list(stub.Process(iter([headers(mode=STREAMED, nowait=False)]), timeout=30))
    assert kinds(out) == ["immediate_response"]
    assert out[0].immediate_response.status.code == 500


def test_requests_the_picker_does_not_route_pass_at_once_in_every_mode(picker):
    app, stub, http = picker()
    raw = b'{"input": "embed me"}'
    for mode, body in ((BUFFERED, [buffered(raw)]), (STREAMED, body_parts(raw)),
                       (DUPLEX, body_parts(raw))):
        msgs = [headers(path="/v1/embeddings", mode=mode), *body]
        out = list(stub.Process(iter(msgs), timeout=30))
        assert kinds(out) == ["request_headers", "request_body"], mode
        assert not mutation(out[0])
        echoed = out[1].request_body.response.body_mutation.streamed_response.body
        assert echoed == (raw if mode == DUPLEX else b"")
    assert sum(in_flight(app).values()) == 0


def test_count_holds_until_the_gateway_closes_the_stream_when_no_response_phase(picker):
    """Envoy with ``response_header_mode: SKIP`` and ``response_trailer_mode: SEND`` sends
    nothing about the response and closes the stream when the HTTP request ends."""
    app, stub, http = picker()
    sent, responses = open_stream(stub, mode=BUFFERED)
    assert kinds([next(responses), next(responses)]) == ["request_headers", "request_body"]
    assert in_flight(app) == {"va": 1, "vb": 0, "sa": 0}
    time.sleep(0.5)                  # nothing comes: the request is still being answered
    assert in_flight(app)["va"] == 1
    sent.put(None)                   # the gateway half-closes: the HTTP request ended
    assert list(responses) == []
    assert wait_for(lambda: in_flight(app)["va"] == 0, 30)


def test_a_silent_stream_gives_up_its_count_after_the_idle_timeout(picker):
    app, stub, http = picker(epp_idle_timeout_s=1.0)
    sent, responses = open_stream(stub, mode=BUFFERED)
    next(responses), next(responses)
    assert sum(in_flight(app).values()) == 1      # decided: counted (the timeout runs)
    assert wait_for(lambda: sum(in_flight(app).values()) == 0, 30)
    # the stream itself stays usable: a late report moves nothing it no longer holds
    sent.put(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
    assert next(responses).WhichOneof("response") == "response_trailers"
    sent.put(None)
    assert list(responses) == [] and sum(in_flight(app).values()) == 0


def test_half_open_probe_without_a_report_is_given_back(picker):
    one = {"pools": {"vllm": [{"name": "va", "url": "http://127.0.0.1:1", "model": "m"}]},
           "workload": {"kv_bytes_per_token": 70272, "batch_size": 64},
           "tokens": {"upstream_tokenize": False},
           "health": {"interval_s": 600, "failure_threshold": 100},
           "breaker": {"failure_threshold": 1, "open_s": 0.0}}
    app, stub, http = picker(one)
    va = upstream(app, "va")
    va.breaker.trip()                       # open_s 0: half-open at the next look
    assert va.breaker.state == "half_open"
    sent, responses = open_stream(stub, mode=BUFFERED)
    next(responses), next(responses)
    assert va.breaker.probing                # this request is the probe
    sent.put(None)
    list(responses)
    assert wait_for(lambda: not va.breaker.probing, 30)
    assert mutation(exchange(stub, SHORT, mode=BUFFERED)[1])[
        "x-engine-advisor-upstream"] == "va"  # the next request may probe


def test_a_body_the_gateway_ends_with_trailers_is_decided_at_the_trailers(picker):
    app, stub, http = picker()
    raw = json.dumps(SHORT).encode()
    msgs = [headers(mode=DUPLEX), pb.ProcessingRequest(request_body=pb.HttpBody(body=raw)),
            pb.ProcessingRequest(request_trailers=pb.HttpTrailers())]
    out = list(stub.Process(iter(msgs), timeout=30))
    assert kinds(out) == ["request_headers", "request_body", "request_trailers"]
    assert mutation(out[0])["x-engine-advisor-upstream"] in ("va", "vb")
    assert out[1].request_body.response.body_mutation.streamed_response.body == raw
