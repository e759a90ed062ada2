"""SGLang's native API in the simulator (/generate, /flush_cache, /v1/tokenize, /v1/detokenize)
against a real process, with httpx."""

from __future__ import annotations

import json

import httpx
import pytest
from simproc import SimProcess

from engine_advisor.sim import tokenizer


@pytest.fixture(scope="module")
def sglang():
    with SimProcess("--engine", "sglang", "--time-scale", "0.001", "--model-name", "sim-s",
                    "--max-model-len", "4096") as s:
        yield s


def _events(text: str) -> list:
    assert text.endswith("data: [DONE]\n\n")
    out = []
    for block in text.split("\n\n")[:-2]:
        assert block.startswith("data: "), block
        out.append(json.loads(block[len("data: "):]))
    return out


def test_generate_text_non_streaming(sglang):
    prompt = "The simulator speaks SGLang's own API too."
    r = httpx.post(sglang.url + "/generate", json={
        "text": prompt, "sampling_params": {"max_new_tokens": 21, "ignore_eos": True,
                                            "temperature": 0.0}})
    assert r.status_code == 200
    out = r.json()
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == len(tokenizer.encode(prompt))
    assert meta["completion_tokens"] == 21 == len(out["output_ids"])
    assert meta["finish_reason"] == {"type": "length", "length": 21}
    assert meta["cached_tokens"] == 0 and isinstance(meta["id"], str) and meta["id"]
    assert meta["e2e_latency"] > 0
    assert tokenizer.encode(out["text"]) == out["output_ids"]


def test_generate_input_ids_default_length_and_natural_stop(sglang):
    ids = list(range(1000, 1100))
    out = httpx.post(sglang.url + "/generate", json={"input_ids": ids}).json()
    meta = out["meta_info"]
    assert meta["prompt_tokens"] == 100
    n = meta["completion_tokens"]
    assert 1 <= n <= 128                              # SGLang's default max_new_tokens
    if n < 128:
        assert meta["finish_reason"] == {"type": "stop", "matched": 0}
    else:
        assert meta["finish_reason"]["type"] == "length"
    # min_new_tokens holds a natural stop back
    longer = httpx.post(sglang.url + "/generate", json={
        "input_ids": ids, "sampling_params": {"min_new_tokens": 128, "max_new_tokens": 128}})
    assert longer.json()["meta_info"]["completion_tokens"] == 128


def test_generate_same_prompt_hits_the_prefix_cache_until_flushed(sglang):
    ids = list(range(2000, 2064))
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    first = httpx.post(sglang.url + "/generate", json=body).json()["meta_info"]
    again = httpx.post(sglang.url + "/generate", json=body).json()["meta_info"]
    assert first["cached_tokens"] == 0 and again["cached_tokens"] == 63   # all but one
    r = httpx.post(sglang.url + "/flush_cache")
    assert r.status_code == 200 and r.text.startswith("Cache flushed.")
    after = httpx.post(sglang.url + "/generate", json=body).json()["meta_info"]
    assert after["cached_tokens"] == 0
    assert httpx.get(sglang.url + "/flush_cache?timeout=1").status_code == 200
    bad = httpx.post(sglang.url + "/flush_cache?timeout=-1")
    assert bad.status_code == 400 and "timeout" in bad.json()["message"]


def test_generate_batch_of_texts_and_of_ids(sglang):
    r = httpx.post(sglang.url + "/generate", json={
        "text": ["one prompt", "another, longer prompt"],
        "sampling_params": [{"max_new_tokens": 3, "ignore_eos": True},
                            {"max_new_tokens": 5, "ignore_eos": True}]})
    outs = r.json()
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [3, 5]
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [
        len(tokenizer.encode("one prompt")), len(tokenizer.encode("another, longer prompt"))]
    assert len({o["meta_info"]["id"] for o in outs}) == 2
    ids = httpx.post(sglang.url + "/generate", json={
        "input_ids": [[5, 6, 7], [8, 9]], "rid": ["a", "b"],
        "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}).json()
    assert [(o["meta_info"]["id"], o["meta_info"]["prompt_tokens"]) for o in ids] == [
        ("a", 3), ("b", 2)]


def test_generate_stream_framing_is_cumulative(sglang):
    with httpx.stream("POST", sglang.url + "/generate", json={
            "text": "stream me", "stream": True,
            "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    events = _events(text)
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 40
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    for e in events:        # everything so far, not a delta
        assert len(e["output_ids"]) == e["meta_info"]["completion_tokens"]
        assert tokenizer.encode(e["text"]) == e["output_ids"]
    assert events[-1]["text"].startswith(events[0]["text"])


def test_generate_batch_stream_tags_items_with_index(sglang):
    with httpx.stream("POST", sglang.url + "/generate", json={
            "input_ids": [[1, 2, 3], [4, 5, 6, 7]], "stream": True,
            "sampling_params": [{"max_new_tokens": 6, "ignore_eos": True},
                                {"max_new_tokens": 9, "ignore_eos": True}]}) as r:
        events = _events("".join(r.iter_text()))
    last = {}
    for e in events:
        last[e["index"]] = e["meta_info"]
    assert last[0]["completion_tokens"] == 6 and last[1]["completion_tokens"] == 9
    assert last[0]["finish_reason"]["type"] == last[1]["finish_reason"]["type"] == "length"


def test_generate_stop_string_cuts_the_text(sglang):
    body = {"input_ids": [11, 12, 13], "sampling_params": {"max_new_tokens": 200,
                                                            "ignore_eos": True}}
    full = httpx.post(sglang.url + "/generate", json=body).json()
    words = full["text"]
    # a stop string taken from the middle of the generated text
    stop = words[len(words) // 2: len(words) // 2 + 4]
    body["sampling_params"]["stop"] = [stop]
    cut = httpx.post(sglang.url + "/generate", json=body).json()
    meta = cut["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in cut["text"] and words.startswith(cut["text"])
    assert meta["completion_tokens"] < 200


@pytest.mark.parametrize("body, status, shape, needle", [
    ({"sampling_params": {"max_new_tokens": 3}}, 400, "message", "Either text, input_ids"),
    ({"text": "x", "input_ids": [1]}, 400, "message", "not both"),
    ({"input_ids": []}, 400, "message", "input_ids cannot be empty"),
    ({"text": "x", "sampling_params": {"max_new_tokens": "many"}}, 400, "string",
     "sampling_params.max_new_tokens"),
    ({"text": "x", "sampling_params": {"max_new_tokens": 3, "min_new_tokens": 5}}, 400,
     "message", "min_new_tokens must be in [0, max_new_tokens(3)]"),
    ({"text": "x", "sampling_params": {"temperature": -1}}, 400, "message", "temperature"),
    ({"input_ids": list(range(1, 5000))}, 400, "message", "longer than the model's context"),
    ({"text": "x", "sampling_params": {"max_new_tokens": 5000}}, 400, "message",
     "maximum context length of 4096"),
    ({"input_ids": [1, -3]}, 400, "string", "input_ids"),
    ([1, 2], 400, "string", "expected a JSON object"),
])
def test_generate_refuses_bad_requests_like_sglang(sglang, body, status, shape, needle):
    r = httpx.post(sglang.url + "/generate", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    text = err if shape == "string" else err["message"]
    assert isinstance(text, str) and needle in text


def test_generate_stream_error_is_an_event(sglang):
    r = httpx.post(sglang.url + "/generate", json={"input_ids": [], "stream": True})
    assert r.status_code == 200           # as SGLang: the stream had started
    (event,) = _events(r.text)
    assert "input_ids cannot be empty" in event["error"]["message"]
    assert event["error"]["code"] == 400


def test_v1_tokenize_and_detokenize(sglang):
    r = httpx.post(sglang.url + "/v1/tokenize", json={"prompt": "hello world"}).json()
    assert r["tokens"] == tokenizer.encode("hello world") and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 4096
    many = httpx.post(sglang.url + "/v1/tokenize", json={"prompt": ["a b", "c"]}).json()
    assert many["count"] == [len(tokenizer.encode("a b")), len(tokenizer.encode("c"))]
    back = httpx.post(sglang.url + "/v1/detokenize", json={"tokens": r["tokens"]}).json()
    assert back == {"text": "hello world"}
    both = httpx.post(sglang.url + "/v1/detokenize", json={"tokens": many["tokens"]}).json()
    assert both == {"text": ["a b", "c"]}
    bad = httpx.post(sglang.url + "/v1/detokenize", json={"tokens": [[1], ["x"]]})
    assert bad.status_code == 400 and "tokens" in bad.json()["message"]


def test_vllm_flavour_has_no_native_routes():
    with SimProcess("--engine", "vllm", "--time-scale", "0.001") as s:
        assert httpx.post(s.url + "/generate", json={"text": "x"}).status_code == 404
        assert httpx.post(s.url + "/flush_cache").status_code == 404
        res = httpx.get(s.url + "/sim/info").json()["time_resolution"]
        assert "time resolution:" in s.log
    assert res["request_overhead_s"] > 0 and res["token_overhead_s"] >= 0
    assert res["min_simulated_s"] == pytest.approx(res["min_wall_s"] / 0.001)


def test_time_resolution_is_logged_and_in_server_info(sglang):
    res = httpx.get(sglang.url + "/sim/info").json()["time_resolution"]
    assert 0 < res["request_overhead_s"] < 5.0
    assert res["min_wall_s"] == pytest.approx(res["faithful_multiple"] * res["request_overhead_s"])
    assert "time resolution:" in sglang.log
    info = httpx.get(sglang.url + "/server_info").json()
    assert info["simulator"] == {"time_scale": 0.001, "time_resolution": res}
