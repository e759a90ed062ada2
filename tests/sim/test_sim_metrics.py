"""Live gauges while requests stream: running / waiting, and aborts on client disconnect."""

from __future__ import annotations

import time

import httpx
import pytest
from simproc import SimProcess

NAMES = {"vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting",
                  "vllm:kv_cache_usage_perc"),
         "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")}


def wait_for(sim: SimProcess, want: dict[str, float], timeout: float = 5.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        got = {k: sim.metric(k) for k in want}
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


def open_streams(client, k: int):
    # create() returns once the response headers arrive; the request then runs in the engine.
    return [client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": f"stream {i}"}], max_tokens=5000,
        stream=True, extra_body={"ignore_eos": True}) for i in range(k)]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_running_and_waiting_gauges_follow_streams(engine):
    running, waiting, usage = NAMES[engine]
    # 5,000 tokens at ~3-15 ms x 0.2 per step: each request would run for seconds.
    with SimProcess("--engine", engine, "--time-scale", "0.2", "--max-running", "4",
                    "--model-name", "m") as sim:
        client = sim.openai()
        streams = open_streams(client, 6)
        assert wait_for(sim, {running: 4, waiting: 2}) == {running: 4, waiting: 2}
        assert sim.metric(usage) > 0
        for s in streams[:3]:
            next(iter(s))           # these three are really streaming tokens
        t0 = time.monotonic()
        for s in streams:
            s.close()
        assert wait_for(sim, {running: 0, waiting: 0}, 2.0) == {running: 0, waiting: 0}
        assert time.monotonic() - t0 < 2.0

        streams = open_streams(client, 3)
        assert wait_for(sim, {running: 3, waiting: 0}) == {running: 3, waiting: 0}
        streams[0].close()
        t0 = time.monotonic()
        assert wait_for(sim, {running: 2}, 1.0) == {running: 2}
        assert time.monotonic() - t0 < 1.0
        for s in streams[1:]:
            s.close()
        assert wait_for(sim, {running: 0}, 2.0) == {running: 0}
        assert sim.metric(usage) == 0


@pytest.fixture(scope="module")
def vllm():
    with SimProcess("--engine", "vllm", "--time-scale", "0.2", "--model-name", "m") as sim:
        yield sim


def test_token_counters_and_histograms_count_requests(vllm):
    names = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
             "vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
             "vllm:inter_token_latency_seconds_count")
    before = {k: vllm.metric(k) for k in names}
    client = vllm.openai()
    for _ in range(3):
        client.completions.create(model="m", prompt=[5] * 50, max_tokens=10,
                                  extra_body={"ignore_eos": True})
    delta = [vllm.metric(k) - before[k] for k in names]
    assert delta == [150, 30, 3, 3, 27]


def test_non_streaming_client_timeout_aborts_the_request(vllm):
    import openai
    client = vllm.openai(timeout=0.5)
    aborted = 'vllm:request_success_total{model_name="m",engine="0",finished_reason="abort"}'
    before = httpx.get(vllm.url + "/metrics").text.count(aborted + " 0")
    with pytest.raises(openai.APITimeoutError):
        client.completions.create(model="m", prompt="long", max_tokens=20_000,
                                  extra_body={"ignore_eos": True})
    assert wait_for(vllm, {"vllm:num_requests_running": 0}, 1.0) == \
        {"vllm:num_requests_running": 0}
    assert httpx.get(vllm.url + "/load").json() == {"server_load": 0}
    assert before == 1
    assert aborted + " 1" in httpx.get(vllm.url + "/metrics").text
