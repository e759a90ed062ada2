"""Fault injection: --fail-rate, X-Return-Error, X-Drop-After, X-Hang and CUDA OOM."""

from __future__ import annotations

import subprocess
import time

import httpx
import openai
import pytest
from simproc import EXE, SimProcess, free_port

CHAT = [{"role": "user", "content": "faults"}]


@pytest.fixture(scope="module")
def sim():
    with SimProcess("--engine", "vllm", "--time-scale", "0.01", "--model-name", "m") as s:
        yield s


def test_fail_rate_gives_openai_shaped_429_500_503():
    with SimProcess("--engine", "vllm", "--time-scale", "0.001", "--fail-rate", "0.5",
                    "--seed", "3", "--model-name", "m") as s:
        client = s.openai()
        ok, statuses = 0, []
        for _ in range(40):
            try:
                client.completions.create(model="m", prompt="x", max_tokens=2)
                ok += 1
            except (openai.RateLimitError, openai.InternalServerError) as exc:
                statuses.append(exc.status_code)
                assert set(exc.body) >= {"message", "type", "code"}
        assert 8 <= ok <= 32
        assert set(statuses) == {429, 500, 503}


@pytest.mark.parametrize("status,exc_type", [(429, openai.RateLimitError),
                                             (500, openai.InternalServerError),
                                             (503, openai.InternalServerError),
                                             (400, openai.BadRequestError)])
def test_x_return_error_forces_status(sim, status, exc_type):
    with pytest.raises(exc_type) as e:
        sim.openai().chat.completions.create(model="m", messages=CHAT, max_tokens=2,
                                             extra_headers={"X-Return-Error": str(status)})
    assert e.value.status_code == status
    r = httpx.post(sim.url + "/v1/completions", headers={"X-Return-Error": str(status)},
                   json={"model": "m", "prompt": "x", "stream": True})
    assert r.status_code == status and r.json()["error"]["code"] == status
    bad = httpx.post(sim.url + "/v1/completions", headers={"X-Return-Error": "abc"},
                     json={"model": "m", "prompt": "x"})
    assert bad.status_code == 400 and "X-Return-Error" in bad.json()["error"]["message"]


def test_x_drop_after_cuts_the_stream_without_done(sim):
    body = {"model": "m", "prompt": "drop", "max_tokens": 50, "stream": True, "ignore_eos": True}
    events = []
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", sim.url + "/v1/completions", json=body,
                          headers={"X-Drop-After": "7"}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line:
                    events.append(line)
    assert len(events) == 7 and "[DONE]" not in "".join(events)
    # The SDK surfaces the cut too, after the tokens that did arrive.
    got = []
    with pytest.raises((httpx.RemoteProtocolError, openai.APIError)):
        for chunk in sim.openai().completions.create(
                model="m", prompt="drop", max_tokens=50, stream=True,
                extra_body={"ignore_eos": True}, extra_headers={"X-Drop-After": "3"}):
            got.append(chunk.choices[0].text)
    assert len(got) == 3
    assert sim.metric("vllm:num_requests_running") == 0


def test_x_hang_never_answers(sim):
    client = sim.openai(timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        client.completions.create(model="m", prompt="x", max_tokens=2,
                                  extra_headers={"X-Hang": "1"})
    assert time.monotonic() - t0 >= 0.5
    r = client.completions.create(model="m", prompt="x", max_tokens=2)   # still serving
    assert r.usage.completion_tokens >= 1


def test_oom_at_or_above_threshold():
    args = ("--engine", "sglang", "--time-scale", "0.001", "--oom-rate", "0.5", "--seed", "1")
    with SimProcess(*args, "--mem-fraction", "0.95") as hot:
        client = hot.openai()
        failures = []
        for _ in range(30):
            try:
                client.completions.create(model="m", prompt="x", max_tokens=2)
            except openai.InternalServerError as exc:
                failures.append(exc)
        assert 5 <= len(failures) <= 25
        assert all(f.status_code == 500 and "CUDA out of memory" in f.message for f in failures)
        body = failures[0].body
        assert body["type"] == "InternalServerError"
    with SimProcess(*args, "--mem-fraction", "0.92") as safe:
        client = safe.openai()
        for _ in range(30):
            client.completions.create(model="m", prompt="x", max_tokens=2)


def test_oom_on_startup_exits_nonzero_with_log():
    r = subprocess.run([EXE, "sim", "--engine", "vllm", "--port", str(free_port()),
                        "--mem-fraction", "0.96", "--oom-on-startup"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "GPU KV cache size:" in r.stdout
    assert "CUDA out of memory" in r.stdout
    r = subprocess.run([EXE, "sim", "--engine", "vllm", "--port", str(free_port()),
                        "--mem-fraction", "0.5", "--kv-bytes-per-token", "10000000"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "max seq len" in r.stdout


def test_x_drop_after_cuts_a_non_streaming_body(sim):
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(sim.url + "/v1/completions", headers={"X-Drop-After": "3"},
                   json={"model": "m", "prompt": "x", "max_tokens": 20, "ignore_eos": True})
    r = httpx.post(sim.url + "/v1/completions", headers={"X-Drop-After": "30"},
                   json={"model": "m", "prompt": "x", "max_tokens": 20, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 20
