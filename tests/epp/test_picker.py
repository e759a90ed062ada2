"""The picker over gRPC in-process (the app under TestClient serves it on its event loop), fed
ext_proc messages the way Envoy sends them: decisions, fallbacks, chunks, errors, in-flight
counts and what the gateway reports back. Upstreams are unreachable addresses: nothing is
proxied, only decided."""

from __future__ import annotations

import json
import time

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from extproc import (
    BUFFERED,
    LONG,
    POOLS,
    SHORT,
    error_of,
    exchange,
    headers,
    in_flight,
    mutation,
    open_stream,
    response_headers,
    upstream,
)

from engine_advisor.service.epp.messages import CHUNK, DESTINATION, LB_NAMESPACE

ENDPOINT = {"va": "127.0.0.1:1", "vb": "127.0.0.1:2", "sa": "127.0.0.1:3"}   # of POOLS
ENGINE = {"va": "vllm", "vb": "vllm", "sa": "sglang"}


def test_answer_names_the_endpoints_in_header_and_metadata_then_echoes_the_body(picker):
    app, stub, http = picker()
    raw = json.dumps({**SHORT, "messages": [{"role": "user", "content": "x" * 150_000}]}
                     ).encode()
    out = exchange(stub, raw)
    first, chunks = out[0], out[1:]
    assert first.WhichOneof("response") == "request_headers"
    set_ = mutation(first)
    engine = http.post("/v1/route", content=raw).json()["engine"]   # the cost model's choice
    assert set_["x-engine-advisor-engine"] == engine
    primary = set_["x-engine-advisor-upstream"]
    # the primary, the chosen engine's other upstream, then the other engine's
    # (retries.other_engine)
    same = [n for n in ("va", "vb", "sa") if ENGINE[n] == engine and n != primary]
    other = [n for n in ("va", "vb", "sa") if ENGINE[n] != engine]
    dest = set_[DESTINATION].split(",")
    assert dest[0] == ENDPOINT[primary] and ENGINE[primary] == engine
    assert dest[1:1 + len(same)] == [ENDPOINT[n] for n in same]
    assert sorted(dest[1 + len(same):]) == sorted(ENDPOINT[n] for n in other)
    meta = first.dynamic_metadata.fields[LB_NAMESPACE].struct_value.fields
    assert meta[DESTINATION].string_value == set_[DESTINATION]
    assert first.request_headers.response.clear_route_cache
    echoed = [c.request_body.response.body_mutation.streamed_response for c in chunks]
    assert b"".join(c.body for c in echoed) == raw
    assert all(len(c.body) <= CHUNK for c in echoed) and len(echoed) == -(-len(raw) // CHUNK)
    assert [c.end_of_stream for c in echoed] == [False] * (len(echoed) - 1) + [True]


def test_same_decision_and_state_as_the_route_endpoint(picker):
    app, stub, http = picker()
    for body, path, engine in ((SHORT, "/v1/chat/completions", "vllm"),
                               (LONG, "/v1/completions", "sglang")):   # 200K: past crossover
        decided = http.post("/v1/route", json=body).json()
        set_ = mutation(exchange(stub, body, path=path)[0])
        assert set_["x-engine-advisor-engine"] == decided["engine"] == engine
    # one round-robin of ties for both: /v1/route and the picker take turns on va and vb
    seen = []
    for _ in range(2):
        seen.append(http.post("/v1/route", json=SHORT).json()["upstream"])
        seen.append(mutation(exchange(stub, SHORT)[0])["x-engine-advisor-upstream"])
    assert seen in (["va", "vb", "va", "vb"], ["vb", "va", "vb", "va"])
    # listing the fallbacks does not take a turn: four picks alone alternate too
    firsts = [mutation(exchange(stub, SHORT)[0])["x-engine-advisor-upstream"] for _ in range(4)]
    assert firsts in (["va", "vb", "va", "vb"], ["vb", "va", "vb", "va"])


def test_engine_key_set_and_client_key_kept_from_the_engines(picker):
    pools = {**POOLS, "client_api_keys": ["client-key"]}
    app, stub, http = picker(pools)
    out = exchange(stub, LONG, path="/v1/completions", authorization="Bearer client-key")
    set_ = mutation(out[0])
    assert set_["authorization"] == "Bearer engine-key"              # sa has an api_key
    out = exchange(stub, SHORT, authorization="Bearer client-key")
    assert "authorization" not in mutation(out[0])
    assert list(out[0].request_headers.response.header_mutation.remove_headers) == [
        "authorization"]
    out = exchange(stub, SHORT)
    im = out[0].immediate_response
    assert im.status.code == 401 and json.loads(im.body)["error"]["param"] == "authorization"


def test_errors_are_immediate_responses_with_the_service_envelope(picker):
    app, stub, http = picker(proxy_max_body_bytes=100_000)
    code, err, hs = error_of(exchange(stub, {**SHORT, "model": "other"}))
    assert (code, err["param"], hs["content-type"]) == (404, "model", "application/json")
    code, err, _ = error_of(exchange(stub, b"{nope"))
    assert code == 400 and "invalid JSON" in err["message"]
    code, err, _ = error_of(exchange(stub, {"model": "m"}, path="/v1/completions"))
    assert (code, err["param"]) == (400, "prompt")
    code, err, _ = error_of(exchange(stub, b"x" * 100_001))
    assert code == 413 and "100000 bytes" in err["message"]

    ups = app.state.proxy.pools.upstreams
    for u in ups:
        u.healthy = False
    code, err, _ = error_of(exchange(stub, SHORT))
    assert code == 503 and "no upstream is available" in err["message"]
    for u in ups:
        u.healthy = True
        u.not_before = time.monotonic() + 30        # every engine answered 429 Retry-After
    code, err, hs = error_of(exchange(stub, SHORT))
    assert code == 429 and 25 <= int(hs["retry-after"]) <= 30
    upstream(app, "sa").not_before = 0               # one engine takes requests again
    assert mutation(exchange(stub, SHORT)[0])["x-engine-advisor-upstream"] == "sa"


def test_a_decision_that_waits_for_a_count_is_answered_once_counted(picker, tmp_path):
    """Where the estimate's plausible range straddles the crossover (here between 20 and 50
    tokens, for 16 output tokens), the picker counts with the local tokenizer before it
    answers, buffered and duplex, and decides as /v1/route does with that count."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = tokenizers.Tokenizer(WordLevel({"[UNK]": 0, "alpha": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    app, stub, http = picker({**POOLS, "tokens": {"upstream_tokenize": False,
                                                  "tokenizer_file": str(tmp_path /
                                                                        "tokenizer.json")}})

    def counted() -> float:
        line = next(x for x in http.get("/metrics").text.splitlines() if x.startswith(
            'engine_advisor_proxy_prompt_token_counts_total{method="tokenizer"}'))
        return float(line.split()[-1])

    for words, engine in ((10, "vllm"), (60, "sglang")):
        body = {"model": "m", "messages": [{"role": "user", "content": "alpha " * words}],
                "max_tokens": 16}
        routed = http.post("/v1/route", json=body).json()
        assert (routed["prompt_tokens_method"], routed["engine"]) == ("tokenizer", engine)
        for mode in (BUFFERED, None):
            before = counted()
            out = exchange(stub, body, mode=mode)
            decided = out[1] if mode == BUFFERED else out[0]   # BUFFERED: the body's answer
            assert mutation(decided)["x-engine-advisor-engine"] == engine
            assert counted() == before + 1


def test_request_without_body_is_left_to_the_gateway(picker):
    app, stub, http = picker()
    out = list(stub.Process(iter([headers("GET", "/v1/models", end=True)]), timeout=30))
    assert len(out) == 1 and not mutation(out[0])
    assert not out[0].HasField("dynamic_metadata")


def test_in_flight_follows_the_endpoint_that_served_and_ends_with_the_response(picker):
    app, stub, http = picker()
    sent, responses = open_stream(stub)
    first = next(responses)
    assert mutation(first)["x-engine-advisor-upstream"] == "va"
    next(responses)                                   # the body, echoed
    assert in_flight(app) == {"va": 1, "vb": 0, "sa": 0}
    # the gateway went past va (connect failure) and vb served: va failed, vb holds it
    sent.put(response_headers(200, "127.0.0.1:2"))
    out = next(responses)
    set_ = {h.header.key: h.header.raw_value.decode()
            for h in out.response_headers.response.header_mutation.set_headers}
    assert set_ == {"x-engine-advisor-engine": "vllm", "x-engine-advisor-upstream": "vb"}
    assert in_flight(app) == {"va": 0, "vb": 1, "sa": 0}
    va, vb = upstream(app, "va"), upstream(app, "vb")
    assert (va.breaker.failures, vb.breaker.failures) == (1, 0)
    sent.put(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: x\n\n")))
    echo = next(responses).response_body.response.body_mutation.streamed_response
    assert echo.body == b"data: x\n\n" and not echo.end_of_stream
    assert in_flight(app)["vb"] == 1
    sent.put(pb.ProcessingRequest(response_body=pb.HttpBody(body=b"", end_of_stream=True)))
    assert next(responses).response_body.response.body_mutation.streamed_response.end_of_stream
    assert in_flight(app)["vb"] == 0
    sent.put(None)
    assert list(responses) == []
    assert in_flight(app) == {"va": 0, "vb": 0, "sa": 0}


def test_in_flight_released_when_the_gateway_drops_the_stream(picker):
    app, stub, http = picker()
    sent, responses = open_stream(stub)
    next(responses)
    assert sum(in_flight(app).values()) == 1
    responses.cancel()                                # the client went away
    deadline = time.monotonic() + 10
    while sum(in_flight(app).values()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sum(in_flight(app).values()) == 0


def test_engine_429_holds_it_back_for_its_retry_after(picker):
    app, stub, http = picker()
    sent, responses = open_stream(stub)
    next(responses), next(responses)
    sent.put(response_headers(429, "127.0.0.1:1", **{"retry-after": "1"}))
    next(responses)
    sent.put(None)
    list(responses)
    va = upstream(app, "va")
    assert 0.5 < va.not_before - time.monotonic() <= 1.0
    assert mutation(exchange(stub, SHORT)[0])["x-engine-advisor-upstream"] == "vb"


def test_endpoints_of_names_and_literals():
    import asyncio

    from engine_advisor.service.epp.endpoints import Endpoints, resolve

    assert resolve("http://127.0.0.1:8000") == "127.0.0.1:8000"
    assert resolve("http://[::1]:30000/v1") == "[::1]:30000"
    assert resolve("http://localhost:9") in ("127.0.0.1:9", "[::1]:9")
    assert resolve("https://10.1.2.3") == "10.1.2.3:443"

    class Up:
        def __init__(self, name, url):
            self.name, self.url = name, url

    ups = [Up("a", "http://localhost:1"), Up("b", "http://no-such-host.invalid:2")]
    eps = Endpoints(ttl_s=0.0)
    asyncio.run(eps.refresh(1, ups))
    assert eps.endpoint(ups[0]) in ("127.0.0.1:1", "[::1]:1") and eps.endpoint(ups[1]) is None
    assert eps.upstream(eps.endpoint(ups[0])) is ups[0]
    assert eps.listed([ups[1], ups[0]], 1) == [ups[0]]  # the unresolvable one is left out
    every = Endpoints()
    asyncio.run(every.refresh(7, ups[:1]))
    picked = [ups[0]]
    assert every.listed(picked, 7) is picked            # all resolved: the list as it is
    assert every.listed([ups[1], ups[0]], 8) == [ups[0]]    # another generation's: checked
    first, version = eps.resolved_at, eps.version
    assert not eps.fresh(1)                     # ttl 0: stale at once
    asyncio.run(eps.refresh(1, ups))            # ttl 0: names are looked up again
    assert eps.resolved_at > first and eps.version == version + 1


def test_cached_answers_are_rebuilt_when_pools_or_endpoints_change():
    """A decision's serialized answer is cached per upstreams named; a new pools generation
    or a new resolution of the endpoints (the stamp) builds it again."""
    from engine_advisor.service.epp.exchange import Answers

    built = []

    def get(stamp, key, tag):
        return answers.get(stamp, key) or answers.put(key, built.append(tag) or tag.encode())

    answers = Answers(kept=2)
    assert get((1, 1), ("a",), "a1") == b"a1"
    assert get((1, 1), ("a",), "a2") == b"a1"       # cached
    assert get((1, 2), ("a",), "a3") == b"a3"       # endpoints resolved anew
    assert get((2, 2), ("a",), "a4") == b"a4"       # pools reloaded
    get((2, 2), ("b",), "b1")
    assert get((2, 2), ("c",), "c1") == b"c1"       # full: starts over
    assert get((2, 2), ("a",), "a5") == b"a5"
    assert built == ["a1", "a3", "a4", "b1", "c1", "a5"]


def test_literal_endpoints_are_not_parsed_again_on_every_request(monkeypatch):
    """IP addresses are resolved once per generation, whatever the ttl: a request does not
    parse the pools' URLs again (it did after the first ttl, 10 µs a request)."""
    import asyncio

    from engine_advisor.service.epp import endpoints

    parsed = []
    real = endpoints._literal
    monkeypatch.setattr(endpoints, "_literal", lambda url: parsed.append(url) or real(url))

    class Up:
        def __init__(self, name, url):
            self.name, self.url = name, url

    lits = [Up("c", "http://127.0.0.1:3"), Up("d", "http://[::1]:4")]
    eps = endpoints.Endpoints(ttl_s=0.0)
    asyncio.run(eps.refresh(2, lits))
    assert eps.endpoint(lits[1]) == "[::1]:4"
    once, seen = eps.resolved_at, len(parsed)
    for _ in range(5):
        asyncio.run(eps.refresh(2, lits))
    assert eps.resolved_at == once and len(parsed) == seen
    asyncio.run(eps.refresh(3, lits))           # a new generation is resolved again
    assert eps.resolved_at > once


def test_a_gateway_in_another_request_body_mode_is_told_so(picker):
    from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode

    app, stub, http = picker()
    for mode, nowait in ((ProcessingMode.STREAMED, False), (ProcessingMode.BUFFERED_PARTIAL, True),
                         (ProcessingMode.NONE, True)):
        first = headers(mode=mode, nowait=nowait)
        code, err, _ = error_of(list(stub.Process(iter([first]), timeout=30)))
        assert code == 500 and "request_body_mode BUFFERED" in err["message"]
        assert "send_body_without_waiting_for_header_response" in err["message"]
    assert sum(in_flight(app).values()) == 0
