"""Fault handling end to end: the proxy as a real process in front of simulator processes.

Retries of 500s on another upstream (and on the other engine), a hanging upstream (504 within
the configured timeout), client disconnects (the engine aborts the request), an upstream
killed mid-stream (an error event, the proxy stays up, later requests go elsewhere) and every
upstream down (503 in the OpenAI format).
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import yaml
from proc import Proc, start_all, wait_for
from test_proxy_e2e import TOKEN, client, pools_yaml

pytestmark = pytest.mark.timeout(120)

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SHORT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
# ~0.6 ms per token at time scale 0.2: 3,000 tokens stream for about two seconds
SLOW = {"model": "kimi-k3", "prompt": "tell me a long story", "max_tokens": 3000,
        "ignore_eos": True}


def proxy_for(path, sims_vllm, sims_sglang, **extra) -> Proc:
    path.write_text(pools_yaml([s.url for s in sims_vllm], [s.url for s in sims_sglang],
                               **extra))
    return Proc("serve", "--upstreams", str(path), "--log-level", "warning", ready="/readyz",
                env={"ENGINE_ADVISOR_ADMIN_TOKEN": TOKEN})


def metric_line(url: str, *needles: str) -> float | None:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if not line.startswith("#") and all(n in line for n in needles):
            return float(line.rsplit(" ", 1)[1])
    return None


# ----------------------------------------------------------------------------- retries
@pytest.fixture(scope="module")
def flaky(tmp_path_factory):
    bad = Proc("sim", "--engine", "vllm", "--fail-rate", "1", "--time-scale", "0.001")
    good = Proc("sim", "--engine", "vllm", "--time-scale", "0.001")
    sg = Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale", "0.001")
    path = tmp_path_factory.mktemp("flaky") / "upstreams.yaml"
    # what is tested is the retry, not the health checker: on a starved machine (CI beside
    # other work) a sim's /health can miss 5 s three times in a row, and the checker would
    # then take the good vLLM out of the pool and send the retry to SGLang
    proxy = proxy_for(path, [bad, good], [sg], breaker={"failure_threshold": 100},
                      health={"timeout_s": 30.0, "failure_threshold": 20})
    procs = start_all(bad, good, sg, proxy)
    try:
        yield {"proxy": proxy, "path": path, "bad": bad, "good": good, "sglang": sg}
    finally:
        for p in procs:
            p.stop()


def test_failed_attempts_are_retried_on_another_upstream(flaky):
    proxy = flaky["proxy"]
    with httpx.Client(base_url=proxy.url, timeout=30) as h:
        for i in range(6):
            r = h.post("/v1/chat/completions", json={**SHORT, "stream": bool(i % 2)})
            assert r.status_code == 200, r.text
            assert r.headers["x-engine-advisor-upstream"] == "vllm-1"
    # the failing upstream got its share first (round-robin among equals) and was retried
    retried = sum(metric_line(proxy.url, "engine_advisor_proxy_retries_total",
                              'upstream="vllm-0"', f'reason="{why}"') or 0
                  for why in ("status",))
    assert retried >= 2
    assert (metric_line(flaky["bad"].url, "vllm:request_success_total", '"stop"') or 0) == 0


def test_then_on_the_other_engine(flaky):
    proxy, path = flaky["proxy"], flaky["path"]
    good = path.read_text()
    doc = yaml.safe_load(good)
    doc["pools"]["vllm"] = doc["pools"]["vllm"][:1]           # only the failing vLLM
    path.write_text(yaml.safe_dump(doc))
    try:
        r = httpx.post(proxy.url + "/v1/upstreams/reload", headers=AUTH)
        assert r.status_code == 200, r.text
        for _ in range(3):
            r = httpx.post(proxy.url + "/v1/chat/completions", json=SHORT, timeout=30)
            assert r.status_code == 200, r.text
            assert r.headers["x-engine-advisor-engine"] == "sglang"
        # without other_engine the vLLM failure is the answer, passed through as it came
        doc["retries"]["other_engine"] = False
        path.write_text(yaml.safe_dump(doc))
        assert httpx.post(proxy.url + "/v1/upstreams/reload", headers=AUTH).status_code == 200
        r = httpx.post(proxy.url + "/v1/chat/completions", json=SHORT, timeout=30)
        assert r.status_code in (429, 500, 503) and r.json()["error"]["message"]
        assert r.headers["x-engine-advisor-upstream"] == "vllm-0"
    finally:
        path.write_text(good)
        httpx.post(proxy.url + "/v1/upstreams/reload", headers=AUTH)


# ----------------------------------------------------------------------------- hangs, kills
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    a = Proc("sim", "--engine", "vllm", "--time-scale", "0.2")
    b = Proc("sim", "--engine", "vllm", "--time-scale", "0.2")
    sg = Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale", "0.001")
    path = tmp_path_factory.mktemp("pair") / "upstreams.yaml"
    proxy = proxy_for(path, [a, b], [sg],
                      timeouts={"first_byte_s": 1.0, "idle_s": 1.0, "total_s": 4.0})
    procs = start_all(a, b, sg, proxy)
    try:
        yield {"proxy": proxy, "vllm-0": a, "vllm-1": b, "sglang": sg}
    finally:
        for p in procs:
            p.stop()


@pytest.mark.parametrize("stream, limit", [(True, 1.0), (False, 4.0)])
def test_hanging_upstream_times_out(pair, stream, limit):
    proxy = pair["proxy"]
    t0 = time.monotonic()
    r = httpx.post(proxy.url + "/v1/chat/completions", json={**SHORT, "stream": stream},
                   headers={"X-Hang": "1"}, timeout=30)
    took = time.monotonic() - t0
    assert r.status_code == 504, r.text
    err = r.json()["error"]
    assert err["code"] == 504 and "timed out" in err["message"]
    assert limit <= took < limit + 1.5
    # the hung request was cancelled upstream too
    name = r.headers["x-engine-advisor-upstream"]
    assert wait_for(lambda: pair[name].metric("vllm:num_requests_running") == 0, 2.0)


def _abort_count(sim: Proc) -> float:
    return metric_line(sim.url, "vllm:request_success_total", 'finished_reason="abort"') or 0.0


def test_client_disconnect_cancels_the_upstream_request(pair):
    proxy = pair["proxy"]
    # streaming: read a few events, then go away
    with httpx.Client(timeout=30) as h:
        with h.stream("POST", proxy.url + "/v1/completions", json={**SLOW, "stream": True}) as r:
            assert r.status_code == 200
            sim = pair[r.headers["x-engine-advisor-upstream"]]
            aborted = _abort_count(sim)
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
            assert sim.metric("vllm:num_requests_running") == 1
    # well before the ~2 s the generation would take
    assert wait_for(lambda: sim.metric("vllm:num_requests_running") == 0, 1.0)
    assert wait_for(lambda: _abort_count(sim) == aborted + 1, 1.0)

    # non-streaming: the client times out and closes the connection
    before = {n: _abort_count(pair[n]) for n in ("vllm-0", "vllm-1")}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(proxy.url + "/v1/completions", json=SLOW, timeout=httpx.Timeout(5, read=0.5))
    assert wait_for(lambda: sum(_abort_count(pair[n]) - before[n] for n in before) == 1, 1.0)
    assert all(pair[n].metric("vllm:num_requests_running") == 0 for n in before)


def test_upstream_killed_mid_stream(pair):
    proxy = pair["proxy"]
    c = client(proxy.url)
    with c.completions.with_streaming_response.create(
            model="kimi-k3", prompt="tell me a long story", max_tokens=3000, stream=True,
            extra_body={"ignore_eos": True}) as resp:
        victim = resp.headers["x-engine-advisor-upstream"]
        stream = resp.parse()
        got = [next(stream) for _ in range(5)]
        assert all(ch.choices[0].text for ch in got)
        pair[victim].kill()
        with pytest.raises(openai.APIError) as info:
            for _ in stream:
                pass
    assert "incomplete" in str(info.value.message)
    assert httpx.get(proxy.url + "/healthz").status_code == 200
    other = "vllm-1" if victim == "vllm-0" else "vllm-0"
    for _ in range(4):
        r = httpx.post(proxy.url + "/v1/chat/completions", json=SHORT, timeout=30)
        assert r.status_code == 200, r.text
        assert r.headers["x-engine-advisor-upstream"] == other
    st = httpx.get(proxy.url + "/v1/upstreams", headers=AUTH).json()
    down = {u["name"]: u for u in st["upstreams"]}[victim]
    assert down["healthy"] is False and down["available"] is False


def test_all_upstreams_down_is_503(pair):
    for name in ("vllm-0", "vllm-1", "sglang"):
        pair[name].kill()
    proxy = pair["proxy"]
    for body in (SHORT, {**SHORT, "stream": True}):
        r = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["code"] == 503 and err["type"] == "service_unavailable"
    # once the health checks noticed, without trying the upstreams
    assert wait_for(lambda: "no upstream is available" in httpx.post(
        proxy.url + "/v1/chat/completions", json=SHORT, timeout=30).json()["error"]["message"],
        3.0, 0.2)
    assert httpx.get(proxy.url + "/healthz").status_code == 200
