"""End to end: SGLang's native ``POST /generate`` through ``engine-advisor serve``, forwarded
to the SGLang pools only (simulators on loopback, raw httpx: SGLang's API has no SDK)."""

from __future__ import annotations

import json

import httpx
import pytest
import yaml
from proc import Proc, start_all

pytestmark = pytest.mark.timeout(180)
SCALE = "0.001"


def _pools(vllm: list[str], sglang: list[tuple[str, int]]) -> str:
    return yaml.safe_dump({
        "pools": {
            "vllm": [{"url": u, "model": "kimi-k3", "dcp_size": 1, "mem_fraction": 0.92}
                     for u in vllm],
            "sglang": [{"name": f"sg-dcp{d}", "url": u, "model": "kimi-k3", "dcp_size": d,
                        "mem_fraction": 0.92} for u, d in sglang],
        },
        "workload": {"kv_bytes_per_token": 70272, "gpu": "B300", "num_gpus": 8,
                     "batch_size": 64, "output_tokens": 2048},
        "health": {"interval_s": 0.2, "timeout_s": 1.0, "failure_threshold": 1},
        "timeouts": {"connect_s": 1.0, "first_byte_s": 5.0, "idle_s": 5.0, "total_s": 30.0},
    })


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    sims = [Proc("sim", "--engine", "vllm", "--time-scale", SCALE),
            Proc("sim", "--engine", "sglang", "--dcp-size", "1", "--time-scale", SCALE),
            Proc("sim", "--engine", "sglang", "--dcp-size", "8", "--time-scale", SCALE)]
    path = tmp_path_factory.mktemp("gen") / "upstreams.yaml"
    path.write_text(_pools([sims[0].url], [(sims[1].url, 1), (sims[2].url, 8)]))
    only_vllm = tmp_path_factory.mktemp("gen") / "vllm.yaml"
    only_vllm.write_text(_pools([sims[0].url], []))
    proxy = Proc("serve", "--upstreams", str(path), "--log-level", "warning", ready="/readyz")
    bare = Proc("serve", "--upstreams", str(only_vllm), "--log-level", "warning",
                ready="/readyz")
    procs = start_all(*sims, proxy, bare)
    try:
        yield {"proxy": proxy, "bare": bare}
    finally:
        for p in procs:
            p.stop()


def test_short_and_long_prompts_go_to_sglang_the_long_one_to_dcp8(cluster):
    url = cluster["proxy"].url
    short = httpx.post(url + "/generate", json={
        "input_ids": list(range(1000, 3000)),
        "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}, timeout=30)
    assert short.status_code == 200, short.text
    assert short.headers["x-engine-advisor-engine"] == "sglang"
    assert short.json()["meta_info"]["prompt_tokens"] == 2000
    long = httpx.post(url + "/generate", json={
        "input_ids": [7] * 200_000, "sampling_params": {"max_new_tokens": 4,
                                                        "ignore_eos": True}}, timeout=30)
    assert long.status_code == 200, long.text[:300]
    assert long.headers["x-engine-advisor-upstream"] == "sg-dcp8"
    assert long.json()["meta_info"]["completion_tokens"] == 4


def test_streamed_text_batch_passes_through(cluster):
    with httpx.stream("POST", cluster["proxy"].url + "/generate", timeout=30, json={
            "text": ["first prompt", "second prompt"], "stream": True,
            "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}) as r:
        assert r.status_code == 200
        assert r.headers["x-engine-advisor-engine"] == "sglang"
        raw = b"".join(r.iter_bytes()).decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = [json.loads(b[6:]) for b in raw.split("\n\n")[:-2]]
    done = {e["index"]: e["meta_info"]["completion_tokens"] for e in events
            if e["meta_info"]["finish_reason"]}
    assert done == {0: 5, 1: 5}


def test_bad_bodies_and_pools_without_sglang_are_refused(cluster):
    url = cluster["proxy"].url
    r = httpx.post(url + "/generate", json={"input_ids": "abc"})
    assert r.status_code == 400 and "input_ids" in r.json()["error"]["message"]
    r = httpx.post(url + "/generate", json={"text": "x", "input_ids": [1]})
    assert r.status_code == 400 and "one of text or input_ids" in r.json()["error"]["message"]
    r = httpx.post(url + "/generate", json={"text": "x",
                                            "sampling_params": {"max_new_tokens": "many"}})
    assert r.status_code == 400 and "max_new_tokens" in r.json()["error"]["message"]
    r = httpx.post(cluster["bare"].url + "/generate", json={"text": "x"})
    assert r.status_code == 404 and "no SGLang pool" in r.json()["error"]["message"]
