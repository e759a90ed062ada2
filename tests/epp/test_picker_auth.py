"""Only the gateway may call the picker: the shared token in the stream's metadata, or mutual
TLS. Streams without it are refused before anything they say moves a breaker or an in-flight
count. Malformed bodies get an immediate 400 naming the problem, a failure of the picker a
500 whose details stay in the log. In-process picker, real gRPC clients on loopback."""

from __future__ import annotations

import logging

import grpc
import pki as pki_files
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from extproc import (
    BUFFERED,
    SHORT,
    Gateway,
    buffered,
    error_of,
    exchange,
    headers,
    in_flight,
    mutation,
    response_headers,
    upstream,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine_advisor.service.epp import exchange as exchange_module

FAILURE_REPORTS = [response_headers(503, f"127.0.0.1:{p}") for p in (1, 2, 3)]


def attack(stub):
    """What an attacker on the picker's port would send: a routed request (a count), then a
    503 report for every endpoint (the breakers), and the stream kept open."""
    msgs = [headers(path="/v1/completions", mode=BUFFERED),
            buffered(b'{"model": "m", "prompt": "x"}'), *FAILURE_REPORTS]
    return list(stub.Process(iter(msgs), timeout=30))


def breaker_failures(app) -> dict[str, int]:
    return {u.name: u.breaker.failures for u in app.state.proxy.pools.upstreams}


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),),
                                      (("authorization", "gateway-secret-3f9a"),)],
                         ids=["none", "wrong", "no-scheme"])
def test_streams_without_the_token_are_refused_and_move_nothing(picker, metadata):
    app, stub, http = picker()
    with pytest.raises(grpc.RpcError) as exc:
        attack(Gateway(stub.stub, metadata))
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert breaker_failures(app) == {"va": 0, "vb": 0, "sa": 0}
    assert sum(in_flight(app).values()) == 0
    assert all(u.breaker.state == "closed" for u in app.state.proxy.pools.upstreams)
    # the gateway's own reports still count
    attack(stub)
    assert breaker_failures(app)["va"] >= 1


def test_health_answers_without_the_token(picker):
    app, stub, http = picker()
    health = health_pb2_grpc.HealthStub(app.state.epp_channel)
    r = health.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=10)
    assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_the_picker_does_not_start_without_authentication(picker):
    with pytest.raises(RuntimeError, match="needs authentication from the gateway"):
        picker(epp_token=None)


@pytest.mark.parametrize("body, says", [
    (b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "nested too deeply"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": '
     + b"9" * 5000 + b"}", "more than 4,300 digits"),
    (b'{"model": "m", "messages": [', "invalid JSON"),
    (b'{"model": "m", "prompt": "\xff\xfe"}', "invalid JSON"),
    (b"[1, 2]", "expected a JSON object"),
], ids=["deep", "huge-int", "truncated", "not-utf8", "not-an-object"])
def test_malformed_bodies_get_an_immediate_400_and_no_traceback(picker, caplog, body, says):
    app, stub, http = picker()
    with caplog.at_level(logging.DEBUG, logger="engine_advisor"):
        for mode in (BUFFERED, None):
            code, err, _ = error_of(exchange(stub, body, path="/v1/completions", mode=mode))
            assert code == 400 and says in err["message"], err
            assert "Traceback" not in err["message"] and "Error" not in err["message"]
    assert not [r for r in caplog.records if r.exc_info], caplog.text
    assert sum(in_flight(app).values()) == 0


def test_a_failure_of_the_picker_is_a_500_with_its_details_in_the_log(picker, caplog,
                                                                      monkeypatch):
    app, stub, http = picker()

    async def broken(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(exchange_module.decision, "pick_endpoints", broken)
    with caplog.at_level(logging.ERROR, logger="engine_advisor.epp"):
        code, err, _ = error_of(exchange(stub, SHORT, mode=BUFFERED))
    assert code == 500 and "secret" not in err["message"]
    assert err["message"] == "internal error; see the server log"
    assert "secret internals" in caplog.text


# ---------------------------------------------------------------------------- mutual TLS
@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if not pki_files.available():
        pytest.skip("no openssl to make certificates with")
    return pki_files.make(tmp_path_factory.mktemp("pki"))


def tls_stub(port: int, pki, client: str | None):
    creds = grpc.ssl_channel_credentials(
        root_certificates=(pki / "ca.pem").read_bytes(),
        private_key=(pki / f"{client}.key").read_bytes() if client else None,
        certificate_chain=(pki / f"{client}.pem").read_bytes() if client else None)
    channel = grpc.secure_channel(f"127.0.0.1:{port}", creds)
    return channel, Gateway(pb_grpc.ExternalProcessorStub(channel), ())


def test_mutual_tls_takes_the_gateway_certificate_only(picker, pki):
    app, _, http = picker(epp_token=None, epp_tls_cert=pki / "server.pem",
                          epp_tls_key=pki / "server.key", epp_tls_client_ca=pki / "ca.pem")
    port = app.state.settings.epp_port
    for client in (None, "rogue"):
        channel, stub = tls_stub(port, pki, client)
        with channel, pytest.raises(grpc.RpcError) as exc:
            attack(stub)
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE, client
    assert breaker_failures(app) == {"va": 0, "vb": 0, "sa": 0}
    assert sum(in_flight(app).values()) == 0
    channel, stub = tls_stub(port, pki, "client")
    with channel:
        out = exchange(stub, SHORT, mode=BUFFERED)
    assert mutation(out[1])["x-engine-advisor-engine"] == "vllm"
    assert upstream(app, "va").breaker.failures == 0


def test_metadata_past_the_header_limit_is_refused_before_the_picker_reads_it(picker):
    """The front door's header limit holds on the picker's port too (grpc.max_metadata_size):
    a stream whose metadata is larger is refused and moves nothing."""
    app, stub, http = picker()
    limit = app.state.settings.max_header_bytes
    big = (*stub.metadata, ("x-pad", "p" * (limit + 1024)))     # the gateway's token too
    with pytest.raises(grpc.RpcError) as exc:
        attack(Gateway(stub.stub, big))
    assert exc.value.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL,
                                grpc.StatusCode.UNAVAILABLE)
    assert breaker_failures(app) == {"va": 0, "vb": 0, "sa": 0}
    assert sum(in_flight(app).values()) == 0
