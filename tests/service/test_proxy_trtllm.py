"""End to end: ``engine-advisor serve --upstreams FILE`` routing to a ``trtllm`` pool of
``engine-advisor sim --engine trtllm`` processes, driven by the official ``openai`` client.

Two proxies: one whose only pool is TensorRT-LLM (every request goes there), one with a vLLM
pool beside it (each request lands where ``POST /v1/route`` says; the default model, with no
TensorRT-LLM data, ranks its physics priors behind vLLM for Kimi-K3 on 8 x B300). trtllm-serve
has no ``/tokenize``: the proxy asks it once, then no more.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import yaml
from proc import Proc, start_all

from engine_advisor.model.engines import trtllm

pytestmark = pytest.mark.timeout(180)

SCALE = "0.001"
TOKEN = "proxy-admin-token"
MODEL = "kimi-k3"
M = trtllm.ENGINE.metrics


def pools_yaml(pools: dict[str, str]) -> str:
    return yaml.safe_dump({
        "pools": {engine: [{"url": url, "model": MODEL, "dcp_size": 1, "mem_fraction": 0.9}]
                  for engine, url in pools.items()},
        "workload": {"preset": MODEL, "gpu": "B300", "num_gpus": 8, "batch_size": 64,
                     "output_tokens": 2048},
        "health": {"interval_s": 0.5, "timeout_s": 5.0, "failure_threshold": 3},
        "timeouts": {"connect_s": 1.0, "first_byte_s": 10.0, "idle_s": 10.0, "total_s": 30.0},
    })


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    sims = {"trtllm": Proc("sim", "--engine", "trtllm", "--time-scale", SCALE),
            "vllm": Proc("sim", "--engine", "vllm", "--time-scale", SCALE)}
    folder = tmp_path_factory.mktemp("proxy-trtllm")
    proxies = {}
    for name, engines in (("solo", ("trtllm",)), ("mixed", ("trtllm", "vllm"))):
        path = folder / f"{name}.yaml"
        p = Proc("serve", "--upstreams", str(path), "--log-level", "warning", ready="/readyz",
                 env={"ENGINE_ADVISOR_UPSTREAMS_WATCH_S": "0",
                      "ENGINE_ADVISOR_ADMIN_TOKEN": TOKEN})
        p.prepare = lambda path=path, engines=engines: path.write_text(
            pools_yaml({e: sims[e].url for e in engines}))
        proxies[name] = p
    procs = start_all(*sims.values(), *proxies.values())
    try:
        yield {**sims, **proxies}
    finally:
        for p in procs:
            p.stop()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30.0)


def counters(cluster) -> dict[str, float]:
    """Prompt tokens each simulator has prefilled, from its own metrics page."""
    trt = httpx.get(cluster["trtllm"].url + "/prometheus/metrics", timeout=5).text
    vl = httpx.get(cluster["vllm"].url + "/metrics", timeout=5).text

    def first(text: str, name: str) -> float:
        line = next(x for x in text.splitlines() if x.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    return {"trtllm": first(trt, M.prompt_tokens), "vllm": first(vl, "vllm:prompt_tokens_total"),
            "trtllm_out": first(trt, M.generation_tokens)}


def test_a_trtllm_pool_serves_chat_completions_and_streams(cluster):
    proxy = cluster["solo"]
    c = client(proxy.url)
    before = counters(cluster)
    chat = c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "What is Helix?"}], max_tokens=12,
        extra_body={"ignore_eos": True})
    assert (chat.headers["x-engine-advisor-engine"], chat.headers["x-engine-advisor-upstream"]
            ) == ("trtllm", "trtllm-0")
    assert chat.parse().usage.completion_tokens == 12
    chunks = list(c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stream it"}], max_tokens=20,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 20
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) == 20
    comp = c.completions.create(model=MODEL, prompt=[7] * 5000, max_tokens=3,
                                extra_body={"ignore_eos": True})
    assert comp.usage.prompt_tokens == 5000
    after = counters(cluster)
    assert after["trtllm_out"] - before["trtllm_out"] == 12 + 20 + 3
    assert after["trtllm"] - before["trtllm"] >= 5000
    assert after["vllm"] == before["vllm"]
    ups = httpx.get(proxy.url + "/v1/upstreams", timeout=5,
                    headers={"Authorization": f"Bearer {TOKEN}"}).json()["upstreams"]
    assert [(u["engine"], u["healthy"]) for u in ups] == [("trtllm", True)]   # /health checked


def test_requests_land_where_the_route_says_beside_a_vllm_pool(cluster):
    proxy = cluster["mixed"]
    c = client(proxy.url)
    for text in ("short question", " ab" * 50_000):
        messages = [{"role": "user", "content": text}]
        decided = httpx.post(proxy.url + "/v1/route", timeout=30, json={
            "model": MODEL, "messages": messages, "max_tokens": 64}).json()
        assert decided["engine"] in ("trtllm", "vllm")
        assert {a["engine"] for a in decided["alternatives"]} | {decided["engine"]} \
            == {"trtllm", "vllm"}                       # both pools were ranked
        before = counters(cluster)
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=64, extra_body={"ignore_eos": True})
        assert raw.headers["x-engine-advisor-engine"] == decided["engine"]
        assert raw.parse().usage.completion_tokens == 64
        after = counters(cluster)
        other = "vllm" if decided["engine"] == "trtllm" else "trtllm"
        assert after[decided["engine"]] > before[decided["engine"]]
        assert after[other] == before[other]


def test_trtllm_serve_is_not_asked_to_tokenize_twice(cluster):
    """The proxy's upstream count against the real processes: trtllm-serve answers 404 and is
    marked; the vLLM simulator counts."""
    from engine_advisor.service.proxy.request import parse
    from engine_advisor.service.proxy.tokens import upstream_count
    from engine_advisor.service.proxy.upstreams import PoolsConfig, Upstream, UpstreamSpec

    cfg = PoolsConfig.model_validate(yaml.safe_load(pools_yaml(
        {"trtllm": cluster["trtllm"].url, "vllm": cluster["vllm"].url})))
    req = parse(b'{"model": "kimi-k3", "prompt": "count these words"}', "/v1/completions")

    async def ask() -> tuple:
        ups = [Upstream.create(e, UpstreamSpec(url=cluster[e].url, model=MODEL), cfg)
               for e in ("trtllm", "vllm")]
        try:
            out = []
            for u in ups:
                out.append((await upstream_count(u, req, 5.0), u.tokenize))
            return tuple(out)
        finally:
            for u in ups:
                await u.client.aclose()

    (trt, trt_ok), (vl, vl_ok) = asyncio.run(ask())
    assert (trt, trt_ok) == (None, False)
    assert vl is not None and vl > 0 and vl_ok     # the vLLM simulator counts
