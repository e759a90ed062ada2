"""``engine-advisor sim --engine trtllm``: trtllm-serve's HTTP surface (OpenAI routes, JSON
``/metrics`` iteration stats, ``/prometheus/metrics``, flat errors, no ``/tokenize``) and its
start-up lines, driven by the official openai client and httpx against a real process."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from simproc import SimProcess

from engine_advisor.model.engines import trtllm
from engine_advisor.model.hardware.gpus import builtin_gpu
from engine_advisor.model.physics.capacity import instance_pool
from engine_advisor.model.physics.shape import bare

GIB = 1024 ** 3


@pytest.fixture(scope="module")
def trt():
    with SimProcess("--engine", "trtllm", "--time-scale", "0.001", "--model-name", "sim-t",
                    "--mem-fraction", "0.88", "--max-running", "64") as s:
        yield s


def _pool(fraction: float, max_running: int | None = None):
    from engine_advisor.model.engines.base import MemoryKnobs
    knobs = MemoryKnobs(max_running=max_running or 0, state_slots=0, no_prefix_cache=False,
                        state_ratio=0.0)
    return instance_pool("trtllm", fraction, builtin_gpu("B300"), bare(27648), 8, 1, knobs)


def _drain(url: str) -> list[dict]:
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    return r.json()


def test_completions_chat_and_streaming_through_the_openai_client(trt):
    client = trt.openai()
    assert [m.id for m in client.models.list().data] == ["sim-t"]
    r = client.completions.create(model="sim-t", prompt="tell me", max_tokens=9,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 9 and r.id.startswith("cmpl-")
    chat = client.chat.completions.create(model="any-name", max_tokens=4,  # name not checked
                                          messages=[{"role": "user", "content": "hi"}],
                                          extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 4 and chat.id.startswith("chatcmpl-")
    chunks = list(client.chat.completions.create(
        model="sim-t", messages=[{"role": "user", "content": "stream"}], max_tokens=6,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 6
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 6


def test_json_metrics_are_the_iteration_stats_since_the_last_call(trt):
    _drain(trt.url)                     # what earlier tests left queued
    client = trt.openai()
    for _ in range(3):
        client.completions.create(model="sim-t", prompt="count me", max_tokens=5,
                                  extra_body={"ignore_eos": True})
    stats = _drain(trt.url)
    assert stats, "three requests ran: their iterations are queued"
    cap = _pool(0.88, 64).capacity_tokens
    for s in stats:
        kv = s["kvCacheStats"]
        assert kv["tokensPerBlock"] == trtllm.TOKENS_PER_BLOCK
        assert kv["maxNumBlocks"] == cap // 32
        assert kv["freeNumBlocks"] + kv["usedNumBlocks"] == kv["maxNumBlocks"]
        assert s["maxBatchSizeStatic"] == s["maxNumActiveRequests"] == 64
        assert s["iterLatencyMS"] > 0 and re.fullmatch(r"\d\d-\d\d-\d{4} [\d:]{8}",
                                                         s["timestamp"])
        assert set(s["inflightBatchingStats"]) >= {"numContextRequests", "numGenRequests",
                                                   "numCtxTokens"}
    assert [s["iter"] for s in stats] == sorted(s["iter"] for s in stats)
    assert sum(s["numCompletedRequests"] for s in stats) == 3
    assert sum(s["inflightBatchingStats"]["numContextRequests"] for s in stats) == 3
    assert _drain(trt.url) == []        # drained: nothing ran since


def test_prometheus_metrics_carry_the_engine_records_names(trt):
    client = trt.openai()
    before = _prom(trt.url)
    client.completions.create(model="sim-t", prompt="x", max_tokens=7,
                              extra_body={"ignore_eos": True})
    after = _prom(trt.url)
    m = trtllm.ENGINE.metrics
    for name in (m.running, m.waiting, m.kv_usage, "trtllm_kv_cache_max_blocks",
                 "trtllm_kv_cache_tokens_per_block", m.ttft + "_bucket", m.inter_token + "_sum",
                 m.e2e + "_count", m.prompt_tokens, m.generation_tokens):
        assert name in after, name
    assert after[m.generation_tokens] - before[m.generation_tokens] == 7
    assert after[m.e2e + "_count"] - before[m.e2e + "_count"] == 1
    assert after["trtllm_kv_cache_max_blocks"] == _pool(0.88, 64).capacity_tokens // 32
    assert after[m.running] == 0 and after[m.kv_usage] == 0.0
    text = httpx.get(trt.url + "/prometheus/metrics").text
    assert f'{m.running}{{model_name="undefined",engine_type="undefined"}} 0' in text


def _prom(url: str) -> dict[str, float]:
    """The first sample of each name on /prometheus/metrics."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/prometheus/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0]
            out.setdefault(name, float(line.rsplit(" ", 1)[1]))
    return out


def test_errors_are_flat_and_tokenize_is_not_served(trt):
    bad = httpx.post(trt.url + "/v1/completions", json={"prompt": "x", "max_tokens": "many"})
    assert bad.status_code == 400
    body = bad.json()
    assert body == {"object": "error", "message": body["message"], "type": "BadRequestError",
                    "param": "max_tokens", "code": 400}
    assert "max_tokens" in body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        trt.openai().chat.completions.create(model="sim-t", messages=[], max_tokens=2)
    assert "messages" in e.value.message
    assert httpx.post(trt.url + "/tokenize", json={"prompt": "x"}).status_code == 404
    assert httpx.get(trt.url + "/version").json()["version"].startswith("1.")
    gen = httpx.get(trt.url + "/health_generate")
    assert gen.status_code == 200 and gen.text == "Generation health check OK"
    assert httpx.get(trt.url + "/get_server_info").status_code == 404


def test_startup_lines_state_the_cost_models_kv_cache(trt):
    pool = _pool(0.88, 64)
    n = pool.capacity_tokens // 32 * 32
    kv = pool.capacity_tokens * 27648 / GIB         # KV bytes per GPU: MLA, one latent head
    total = builtin_gpu("B300").memory_bytes
    used = 0.88 * total - kv * GIB
    free = trtllm.free_fraction(0.88, total, used)
    log = trt.log
    assert f"[MemUsageChange] Allocated {kv:.2f} GiB for max tokens in paged KV cache ({n})." \
        in log
    assert f"[TRT-LLM] [I] Estimated max memory in KV cache : {kv:.2f} GiB" in log
    assert "[TensorRT-LLM][INFO] Number of tokens per block: 32." in log
    assert (f"available KV cache memory when calculating max tokens: {kv:.2f} GiB, fraction "
            f"is set {round(free, 4)}") in log
    assert "max_seq_len=262144, max_num_requests=64, max_num_tokens=8192, max_batch_size=64" \
        in log
    assert "physics priors, uncalibrated" in log


def test_a_max_seq_len_longer_than_the_cache_is_cut_to_it():
    from engine_advisor.sim.config import SimConfig
    from engine_advisor.sim.engines.base import longest

    # the default served model, Kimi-K3 (weights known)
    pool = SimConfig(engine="trtllm", mem_fraction=0.72).pool()
    fit = min(pool.capacity_tokens // 32 * 32, longest(pool))   # whole blocks, one request
    assert 100_000 < fit < 4_000_000
    with SimProcess("--engine", "trtllm", "--time-scale", "0.001", "--mem-fraction", "0.72",
                    "--max-model-len", "4000000") as s:
        assert f"Adjusted max_seq_len to {fit}" in s.log
        assert f"max_seq_len={fit}," in s.log
        card = httpx.get(s.url + "/v1/models").json()["data"][0]
        assert card["max_model_len"] == fit
