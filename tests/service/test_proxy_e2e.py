"""End to end: ``engine-advisor serve --upstreams FILE`` in front of simulator processes
(vLLM-like and SGLang-like), driven by the official ``openai`` client and raw httpx.

Pools serve Kimi-K3 (the simulators' default model) on B300 x 8 with a batch floor of 64, where
the default model puts the crossover near 153K context tokens at 2,048 output tokens: short
prompts belong to vLLM dcp 1, long ones to SGLang dcp 8.
"""

from __future__ import annotations

import json
import os
import re
import signal

import httpx
import openai
import pytest
import yaml
from proc import Proc, start_all, wait_for

from engine_advisor.model.fit.dataset import parse_csv
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload

pytestmark = pytest.mark.timeout(120)

TOKEN = "proxy-admin-token"
SCALE = "0.001"
LONG_CHAT = " ab" * 190_000          # 190,000 simulator tokens, ~570 KB: /tokenize decides


def pools_yaml(vllm: list[str], sglang: list[str], **extra) -> str:
    doc = {
        "pools": {
            "vllm": [{"url": u, "model": "kimi-k3", "dcp_size": 1, "mem_fraction": 0.92}
                     for u in vllm],
            "sglang": [{"url": u, "model": "kimi-k3", "dcp_size": 8, "mem_fraction": 0.92}
                       for u in sglang],
        },
        "workload": {"preset": "kimi-k3", "gpu": "B300", "num_gpus": 8,
                     "batch_size": 64, "output_tokens": 2048},
        # lenient: no test here stops an upstream, and on a loaded machine (CI next to other
        # work) one slow /health answer must not send traffic to the other pool
        "health": {"interval_s": 0.5, "timeout_s": 5.0, "failure_threshold": 3},
        "timeouts": {"connect_s": 1.0, "first_byte_s": 5.0, "idle_s": 5.0, "total_s": 20.0},
        "retries": {"max_attempts": 3, "backoff_base_s": 0.01, "backoff_max_s": 0.1},
    }
    for k, v in extra.items():
        doc[k] = {**doc.get(k, {}), **v} if isinstance(v, dict) else v
    return yaml.safe_dump(doc)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    sims = [Proc("sim", "--engine", "vllm", "--time-scale", SCALE),
            Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale", SCALE)]
    path = tmp_path_factory.mktemp("proxy") / "upstreams.yaml"
    proxy = Proc("serve", "--upstreams", str(path), "--log-level", "warning", ready="/readyz",
                 env={"ENGINE_ADVISOR_ADMIN_TOKEN": TOKEN,
                      "ENGINE_ADVISOR_UPSTREAMS_WATCH_S": "0"})   # reloads: admin or SIGHUP
    # written at start, once the simulators' ports are final
    proxy.prepare = lambda: path.write_text(pools_yaml([sims[0].url], [sims[1].url]))
    procs = start_all(*sims, proxy)
    try:
        yield {"vllm": sims[0], "sglang": sims[1], "proxy": proxy, "path": path}
    finally:
        for p in procs:
            p.stop()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30.0)


def normalise(raw: bytes) -> bytes:
    """Blank what differs between two runs of the same request (ids, timestamps)."""
    raw = re.sub(rb'"id":"[^"]*"', b'"id":""', raw)
    return re.sub(rb'"created":\d+', b'"created":0', raw)


def test_short_prompt_to_vllm_long_to_sglang_as_the_model_says(cluster):
    proxy = cluster["proxy"]
    c = client(proxy.url)
    short = c.chat.completions.with_raw_response.create(
        model="kimi-k3", messages=[{"role": "user", "content": "What is DCP?"}], max_tokens=16)
    assert (short.headers["x-engine-advisor-engine"], short.headers["x-engine-advisor-upstream"]
            ) == ("vllm", "vllm-0")
    body = short.parse()
    assert 1 <= body.usage.completion_tokens <= 16 and body.choices[0].message.content
    assert 0 < body.usage.prompt_tokens < 100

    long = c.chat.completions.with_raw_response.create(
        model="kimi-k3", messages=[{"role": "user", "content": LONG_CHAT}], max_tokens=2048,
        extra_body={"ignore_eos": True})
    assert long.headers["x-engine-advisor-engine"] == "sglang"
    assert long.headers["x-engine-advisor-upstream"] == "sglang-0"
    usage = long.parse().usage
    assert usage.completion_tokens == 2048
    assert usage.prompt_tokens > 160_000           # counted by the simulator itself

    # The model agrees: the pools' workload at these contexts through POST /v1/recommend.
    for ctx, engine in ((usage.prompt_tokens, "sglang"), (body.usage.prompt_tokens, "vllm")):
        rec = httpx.post(proxy.url + "/v1/recommend", json={
            "context_tokens": ctx, "output_tokens": 2048, "batch_size": 64,
            "preset": "kimi-k3", "gpu": "B300", "num_gpus": 8}).json()
        assert (rec["engine"], rec["dcp_size"]) == (engine, 8 if engine == "sglang" else 1)


def test_route_endpoint_counts_tokens_upstream_when_the_estimate_is_ambiguous(cluster):
    proxy = cluster["proxy"]
    # a prompt whose bytes / 4 lie below the model's crossover for the pools' workload and whose
    # tokens lie above it: " ab" is one simulator token of three bytes
    w = Workload(context_tokens=100_000, preset="kimi-k3", gpu="B300", num_gpus=8,
                 batch_size=64, output_tokens=2048)
    m = default_model()
    cross = recommend(m, w, m.version).crossover_context_tokens
    n = int(cross * 1.2)
    assert 3 * n / 4 < cross < n
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": " ab" * n}],
            "max_tokens": 2048}
    r = httpx.post(proxy.url + "/v1/route", json=body, timeout=30)
    assert r.status_code == 200, r.text
    d = r.json()
    # bytes/4 would say vLLM; the simulator's /tokenize says SGLang.
    assert d["prompt_tokens_method"] == "upstream"
    assert d["prompt_tokens"] > n
    assert (d["engine"], d["dcp_size"], d["upstream"]) == ("sglang", 8, "sglang-0")
    assert d["upstream_url"] == cluster["sglang"].url
    p = d["predicted"]
    assert 0 < p["ttft_s"] < p["total_s"] and p["tpot_s"] > 0 and p["calibrated"]
    alt = d["alternatives"][0]
    assert (alt["engine"], alt["dcp_size"]) == ("vllm", 1)
    assert alt["predicted"]["total_s"] > p["total_s"]
    assert d["confidence"] in ("high", "medium", "low") and d["batch_size"] == 64

    short = httpx.post(proxy.url + "/v1/route", json={
        "model": "kimi-k3", "prompt": "one two three", "max_tokens": 8}).json()
    assert (short["engine"], short["prompt_tokens_method"]) == ("vllm", "estimate")
    given = httpx.post(proxy.url + "/v1/route", json={"context_tokens": 200_000}).json()
    assert (given["engine"], given["prompt_tokens"], given["output_tokens"]) == (
        "sglang", 200_000, 2048)
    bad = httpx.post(proxy.url + "/v1/route", json={"context_tokens": -1})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "context_tokens"


def test_streaming_is_passed_through_byte_for_byte(cluster):
    proxy, sim = cluster["proxy"], cluster["vllm"]
    body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "stream please"}],
            "max_tokens": 40, "stream": True, "seed": 7,
            "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=30) as h:
        direct = h.post(sim.url + "/v1/chat/completions", json=body).content
        r = h.post(proxy.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-engine-advisor-engine"] == "vllm"
    assert r.content.endswith(b"data: [DONE]\n\n")
    assert normalise(r.content) == normalise(direct)

    # and with the openai client: text, usage in the last chunk
    c = client(proxy.url)
    chunks = list(c.chat.completions.create(**{k: v for k, v in body.items()
                                               if k != "stream"}, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[-1].usage.completion_tokens == 40 and text
    full = c.chat.completions.create(**{k: v for k, v in body.items()
                                        if k not in ("stream", "stream_options")})
    assert full.choices[0].message.content == text


def test_completions_streaming_and_models(cluster):
    proxy = cluster["proxy"]
    c = client(proxy.url)
    with c.completions.with_streaming_response.create(
            model="kimi-k3", prompt=[5] * 190_000, max_tokens=2048, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}) as resp:
        assert resp.headers["x-engine-advisor-engine"] == "sglang"
        chunks = list(resp.parse())
    assert chunks[-1].usage.prompt_tokens == 190_000
    assert chunks[-1].usage.completion_tokens == 2048
    assert sum(1 for ch in chunks if ch.choices) == 2048

    models = c.models.list()
    assert [m.id for m in models.data] == ["kimi-k3"]


def test_request_id_observations_and_metrics(cluster):
    proxy = cluster["proxy"]
    r = httpx.post(proxy.url + "/v1/completions", headers={"X-Request-Id": "trace-77"},
                   json={"model": "kimi-k3", "prompt": "hi", "max_tokens": 4, "stream": True})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-77"

    denied = httpx.get(proxy.url + "/v1/observations")
    assert denied.status_code == 401
    obs = httpx.get(proxy.url + "/v1/observations",
                    headers={"Authorization": f"Bearer {TOKEN}"})
    assert obs.status_code == 200 and obs.headers["content-type"].startswith("text/csv")
    rows = parse_csv(obs.text)
    assert {r.engine for r in rows} == {"vllm", "sglang"}
    assert {r.source for r in rows} == {"proxy:vllm-0", "proxy:sglang-0"}
    streamed = [r for r in rows if r.ttft_s is not None]
    assert streamed and all(r.tpot_s is None or r.tpot_s > 0 for r in streamed)
    sg = [r for r in rows if r.engine == "sglang"]
    assert all(r.dcp_size == 8 and r.kv_bytes_per_token == 27648 for r in sg)
    assert any(r.context_tokens == 190_000 and r.output_tokens == 2048 for r in sg)

    text = httpx.get(proxy.url + "/metrics").text
    assert 'engine_advisor_proxy_requests_total{engine="vllm",status="200",upstream="vllm-0"}' \
        in text
    assert re.search(r'engine_advisor_proxy_tpot_observed_over_predicted_count\{engine="sglang"\}'
                     r" [1-9]", text)
    assert 'engine_advisor_proxy_upstream_healthy{upstream="sglang-0"} 1.0' in text
    assert 'engine_advisor_proxy_breaker_state{upstream="vllm-0"} 0.0' in text


def test_reload_keeps_old_pools_on_a_bad_file_and_applies_a_good_one(cluster):
    proxy, path = cluster["proxy"], cluster["path"]
    good = path.read_text()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        path.write_text("pools: {vllm: [{url: 'not a url', model: m}]}\nworkload: {}\n")
        r = httpx.post(proxy.url + "/v1/upstreams/reload", headers=auth)
        assert r.status_code == 422, r.text
        assert "pools.vllm.0.url" in r.json()["error"]["message"]
        assert "keeping the previous pools" in r.json()["error"]["message"]
        st = httpx.get(proxy.url + "/v1/upstreams", headers=auth).json()
        assert sorted(u["name"] for u in st["upstreams"]) == ["sglang-0", "vllm-0"]
        assert st["last_reload"]["ok"] is False
        ok = httpx.post(proxy.url + "/v1/chat/completions", json={
            "model": "kimi-k3", "messages": [{"role": "user", "content": "still up?"}]})
        assert ok.status_code == 200

        # a good file with the vLLM upstream renamed is applied
        doc = yaml.safe_load(good)
        doc["pools"]["vllm"][0]["name"] = "v-renamed"
        path.write_text(yaml.safe_dump(doc))
        r = httpx.post(proxy.url + "/v1/upstreams/reload", headers=auth)
        assert r.status_code == 200, r.text
        assert sorted(r.json()["upstreams"]) == ["sglang-0", "v-renamed"]
        again = httpx.post(proxy.url + "/v1/completions", json={
            "model": "kimi-k3", "prompt": "short", "max_tokens": 2})
        assert again.headers["x-engine-advisor-upstream"] == "v-renamed"
    finally:
        path.write_text(good)
        httpx.post(proxy.url + "/v1/upstreams/reload", headers=auth)


def test_bad_requests_get_openai_errors(cluster):
    proxy = cluster["proxy"]
    with httpx.Client(base_url=proxy.url, timeout=10) as h:
        r = h.post("/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
        assert r.status_code == 400 and "invalid JSON" in r.json()["error"]["message"]
        r = h.post("/v1/chat/completions", json={"model": "nope", "messages": [
            {"role": "user", "content": "x"}]})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
        r = h.post("/v1/completions", json={"model": "kimi-k3", "prompt": "x", "max_tokens": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        # the upstream's own 400 comes back as it was
        r = h.post("/v1/completions", json={"model": "kimi-k3", "prompt": "x", "n": 2})
        assert r.status_code == 400 and "n" in r.json()["error"]["message"]
        # the body cap of the proxy routes is separate from /v1/recommend's 1 MiB
        big = json.dumps({"model": "kimi-k3", "prompt": "a" * (2 << 20), "max_tokens": 1})
        r = h.post("/v1/route", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
        r = h.post("/v1/recommend", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413


def test_sighup_reloads_the_pools_file(cluster):
    proxy, path = cluster["proxy"], cluster["path"]
    auth = {"Authorization": f"Bearer {TOKEN}"}
    good = path.read_text()
    before = httpx.get(proxy.url + "/v1/upstreams", headers=auth).json()["generation"]
    doc = yaml.safe_load(good)
    doc["pools"]["sglang"][0]["name"] = "sg-hup"
    try:
        path.write_text(yaml.safe_dump(doc))
        os.kill(proxy.proc.pid, signal.SIGHUP)
        wait_for(lambda: httpx.get(proxy.url + "/v1/upstreams", headers=auth)
                 .json()["generation"] > before, 5, 0.05)
        st = httpx.get(proxy.url + "/v1/upstreams", headers=auth).json()
        assert st["last_reload"]["trigger"] == "SIGHUP" and st["last_reload"]["ok"]
        assert "sg-hup" in {u["name"] for u in st["upstreams"]}
        assert proxy.proc.poll() is None
    finally:
        path.write_text(good)
        httpx.post(proxy.url + "/v1/upstreams/reload", headers=auth)


def test_a_proxy_starts_after_its_upstreams_and_never_sees_them_starting(tmp_path):
    """``start_all`` starts a proxy once its upstreams answer /health (tests/proc.py). Started
    beside them, its first health checks found a simulator still starting (/health 503),
    took it out of the pool until the next check after it was up, and the readiness of
    either process showed nothing: on a loaded machine short prompts went to SGLang."""
    slow = Proc("sim", "--engine", "vllm", "--time-scale", SCALE, "--startup-seconds", "5")
    sg = Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale", SCALE)
    path = tmp_path / "upstreams.yaml"
    # down at the first failed check and checked again only after the test: a proxy that
    # looked while vLLM was starting keeps it out of the pool
    proxy = Proc("serve", "--upstreams", str(path), "--log-level", "warning", ready="/readyz",
                 env={"ENGINE_ADVISOR_ADMIN_TOKEN": TOKEN,
                      "ENGINE_ADVISOR_UPSTREAMS_WATCH_S": "0"})
    proxy.prepare = lambda: path.write_text(pools_yaml(
        [slow.url], [sg.url], health={"interval_s": 60.0, "failure_threshold": 1}))
    procs = start_all(proxy, slow, sg)          # the order given does not matter
    try:
        seen = httpx.get(proxy.url + "/v1/upstreams",
                         headers={"Authorization": f"Bearer {TOKEN}"}).json()["upstreams"]
        assert sorted((u["name"], u["healthy"], u["available"], u["last_error"])
                      for u in seen) == [("sglang-0", True, True, None),
                                         ("vllm-0", True, True, None)], proxy.log
        r = httpx.post(proxy.url + "/v1/chat/completions", timeout=30, json={
            "model": "kimi-k3", "messages": [{"role": "user", "content": "What is DCP?"}],
            "max_tokens": 16})
        assert r.status_code == 200, r.text
        assert r.headers["x-engine-advisor-upstream"] == "vllm-0"
    finally:
        for p in procs:
            p.stop()
