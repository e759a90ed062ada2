"""The simulator's HTTP surface, driven by the official openai client against a real process."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from simproc import SimProcess

from engine_advisor.model.hardware.gpus import builtin_gpu
from engine_advisor.model.physics.capacity import instance_pool
from engine_advisor.model.physics.shape import bare
from engine_advisor.sim import tokenizer


@pytest.fixture(scope="module")
def vllm():
    with SimProcess("--engine", "vllm", "--time-scale", "0.001", "--model-name", "sim-m",
                    "--seed", "7") as s:
        yield s


@pytest.fixture(scope="module")
def sglang():
    with SimProcess("--engine", "sglang", "--time-scale", "0.001", "--dcp-size", "8",
                    "--mem-fraction", "0.88", "--model-name", "sim-s") as s:
        yield s


def test_models_lists_the_served_name(vllm):
    models = vllm.openai().models.list()
    assert [m.id for m in models.data] == ["sim-m"]


def test_completion_usage_is_exact(vllm):
    client = vllm.openai()
    prompt = "Deterministic tokenizers make usage counts checkable."
    count = httpx.post(vllm.url + "/tokenize", json={"prompt": prompt}).json()["count"]
    r = client.completions.create(model="sim-m", prompt=prompt, max_tokens=37,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert r.usage.prompt_tokens == count == len(tokenizer.encode(prompt))
    assert r.usage.completion_tokens == 37
    assert r.usage.total_tokens == count + 37
    assert r.choices[0].finish_reason == "length"
    assert len(tokenizer.encode(r.choices[0].text)) == 37


def test_token_id_prompt_counts_its_length(vllm):
    r = vllm.openai().completions.create(model="sim-m", prompt=list(range(300, 1300)),
                                         max_tokens=3, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == 1000
    assert r.usage.completion_tokens == 3


def test_chat_non_streaming(vllm):
    r = vllm.openai().chat.completions.create(
        model="sim-m", messages=[{"role": "user", "content": "hello"}], max_tokens=12,
        extra_body={"ignore_eos": True})
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.usage.completion_tokens == 12
    assert len(tokenizer.encode(r.choices[0].message.content)) == 12
    tok = httpx.post(vllm.url + "/tokenize",
                     json={"messages": [{"role": "user", "content": "hello"}]}).json()
    assert r.usage.prompt_tokens == tok["count"]


def test_chat_streaming_with_usage_chunk(vllm):
    stream = vllm.openai().chat.completions.create(
        model="sim-m", messages=[{"role": "user", "content": "stream please"}], max_tokens=20,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len(content) == 20
    assert content[-1].choices[0].finish_reason == "length"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 20
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content for c in content)
    assert len(tokenizer.encode(text)) == 20


def test_completion_streaming_matches_non_streaming(vllm):
    client = vllm.openai()
    kw = dict(model="sim-m", prompt="same prompt same text", max_tokens=15,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw))
    assert streamed == full


def test_raw_sse_format(vllm):
    body = {"model": "sim-m", "prompt": "raw", "max_tokens": 4, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", vllm.url + "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert [len(p["choices"]) for p in payloads] == [1, 1, 1, 1, 0]
    assert payloads[-1]["usage"]["completion_tokens"] == 4


def test_generation_is_deterministic_and_respects_min_tokens(vllm):
    client = vllm.openai()
    kw = dict(model="sim-m", prompt="pseudo eos", max_tokens=2000)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text
    assert a.usage.completion_tokens == b.usage.completion_tokens
    natural = a.usage.completion_tokens
    assert a.choices[0].finish_reason == ("stop" if natural < 2000 else "length")
    forced = client.completions.create(model="sim-m", prompt="pseudo eos", max_tokens=2000,
                                       extra_body={"min_tokens": natural + 5})
    assert forced.usage.completion_tokens >= natural + 5
    other = client.completions.create(seed=123, **kw)
    assert other.choices[0].text != a.choices[0].text


def test_bad_requests_raise_sdk_errors_with_vllm_envelope(vllm):
    client = vllm.openai()
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="sim-m", prompt="x", max_tokens=0)
    assert "max_tokens" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="sim-m", prompt=[1, 2, 3], max_tokens=262_143)
    assert "maximum context length" in e.value.message
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="sim-m", prompt="x", max_tokens=2,
                                  extra_body={"min_tokens": 5})
    r = httpx.post(vllm.url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == 400
    assert err["type"] == "BadRequestError"


def test_tokenize_detokenize_roundtrip(vllm):
    text = "Mixed: ASCII, digits 12345,\nnewlines and ünïcödé ✓"
    tok = httpx.post(vllm.url + "/tokenize", json={"prompt": text}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 262_144
    back = httpx.post(vllm.url + "/detokenize", json={"tokens": tok["tokens"]}).json()
    assert back == {"prompt": text}
    bad = httpx.post(vllm.url + "/detokenize", json={"tokens": [-1]})
    assert bad.status_code == 400 and "tokens" in bad.json()["error"]["message"]


def test_vllm_only_endpoints(vllm):
    assert httpx.get(vllm.url + "/version").json()["version"].startswith("0.")
    assert httpx.get(vllm.url + "/load").json() == {"server_load": 0}
    assert httpx.get(vllm.url + "/get_server_info").status_code == 404
    text = httpx.get(vllm.url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        assert f'{name}{{model_name="sim-m"' in text, name


def _capacity(engine: str, fraction: float, dcp: int) -> int:
    """The recommender's capacity of the served model (27,648 KV bytes per token, no weights
    known), as tests/sim/test_sim_capacity.py checks it against the recommender's own."""
    return instance_pool(engine, fraction, builtin_gpu("B300"), bare(27648), 8,
                         dcp).capacity_tokens


def test_vllm_startup_log_reports_kv_capacity(vllm):
    cap = _capacity("vllm", 0.9, 1)
    assert f"GPU KV cache size: {cap:,} tokens" in vllm.log


def test_sglang_server_info_and_log(sglang):
    info = httpx.get(sglang.url + "/get_server_info").json()
    assert info["dcp_size"] == 8 and info["tp_size"] == 8
    assert info["mem_fraction_static"] == 0.88
    cap = _capacity("sglang", 0.88, 8)
    assert info["max_total_num_tokens"] == cap
    assert httpx.get(sglang.url + "/server_info").json()["dcp_size"] == 8
    assert f"KV Cache is allocated. #tokens: {cap}" in sglang.log
    assert f"max_total_num_tokens={cap}" in sglang.log
    assert httpx.get(sglang.url + "/get_model_info").json()["model_path"] == "sim-s"
    assert httpx.get(sglang.url + "/health_generate").status_code == 200
    assert httpx.get(sglang.url + "/version").status_code == 404


def test_sglang_metrics_and_flat_errors(sglang):
    client = sglang.openai()
    r = client.chat.completions.create(model="anything", max_tokens=5,
                                       messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5
    text = httpx.get(sglang.url + "/metrics").text
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                 "sglang:gen_throughput", "sglang:cache_hit_rate",
                 "sglang:time_to_first_token_seconds_bucket",
                 "sglang:time_per_output_token_seconds_bucket"):
        assert f'{name}{{model_name="sim-s"' in text, name
    assert sglang.metric("sglang:time_to_first_token_seconds_count") >= 1
    bad = httpx.post(sglang.url + "/v1/completions", json={"prompt": "x", "max_tokens": "many"})
    assert bad.status_code == 400
    body = bad.json()
    assert body["object"] == "error" and body["param"] == "max_tokens" and body["code"] == 400
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="x", prompt="x", max_tokens=-1)
    back = httpx.post(sglang.url + "/detokenize",
                      json={"tokens": tokenizer.encode("hello world")}).json()
    assert back == {"text": "hello world"}


def test_health_is_503_during_startup():
    # the start-up window outlasts a busy machine's gap between listening and the first
    # probes; reaching the listening state may take as long as any simulator's start
    with SimProcess("--engine", "sglang", "--startup-seconds", "3", wait=False) as s:
        import time
        deadline = time.monotonic() + s.timeout
        while not s.listening():
            assert s.proc.poll() is None and time.monotonic() < deadline, s.log
            time.sleep(0.05)
        first = httpx.get(s.url + "/health").status_code
        gen = httpx.get(s.url + "/health_generate").status_code
        with pytest.raises(openai.InternalServerError):
            s.openai().completions.create(model="x", prompt="x", max_tokens=1)
        s.wait_ready()
        assert (first, gen) == (503, 503)
        assert httpx.get(s.url + "/health_generate").status_code == 200


def test_cli_rejects_bad_settings():
    import subprocess

    from simproc import EXE
    r = subprocess.run([EXE, "sim", "--engine", "vllm", "--port", "1", "--mem-fraction", "1.5",
                        "--dcp-size", "3"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.startswith("engine-advisor: error:")
    assert "--mem-fraction" in r.stderr and "--dcp-size" in r.stderr
