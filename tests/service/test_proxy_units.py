"""Proxy pieces in-process: circuit breaker, pools file validation, decision buckets, SSE
framing, request parsing, the app without pools, body caps, client keys, file watch, CLI."""

from __future__ import annotations

import contextlib
import io
import time

import pytest
import seedload
import yaml
from fastapi.testclient import TestClient
from proc import wait_for
from svc_helpers import assert_error

from engine_advisor.model.fit.default import default_model
from engine_advisor.service.errors import ApiError
from engine_advisor.service.holder import LoadedModel
from engine_advisor.service.main import create_app
from engine_advisor.service.proxy.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from engine_advisor.service.proxy.decision import Decider, bucket, representative
from engine_advisor.service.proxy.relay.failure import retry_after
from engine_advisor.service.proxy.relay.stream import ends_with_done, event_end
from engine_advisor.service.proxy.request import CHAT, COMPLETIONS, parse
from engine_advisor.service.proxy.upstreams import Pools, Upstream, UpstreamsError, read
from engine_advisor.service.proxy.upstreams import parse as parse_pools
from engine_advisor.service.settings import Settings

BASE = {"pools": {"vllm": [{"url": "http://127.0.0.1:1", "model": "m", "dcp_size": 1}],
                  "sglang": [{"url": "http://127.0.0.1:2/v1", "model": "m", "dcp_size": 8}]},
        "workload": {"preset": "kimi-k3", "batch_size": 64},
        # unreachable upstreams stay "healthy" for these tests: no check fails them in time
        "health": {"interval_s": 60, "failure_threshold": 100}}


def write(tmp_path, doc, name="up.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc))
    return p


# ----------------------------------------------------------------------------- breaker
def test_breaker_opens_half_opens_and_closes():
    now = [0.0]
    seen = []
    b = CircuitBreaker(3, 10.0, clock=lambda: now[0], on_change=seen.append)
    for _ in range(2):
        b.failure()
    assert b.state == CLOSED and b.available()
    b.success()                     # resets the count of consecutive failures
    for _ in range(2):
        b.failure()
    assert b.state == CLOSED
    b.failure()
    assert b.state == OPEN and not b.available()
    now[0] = 9.9
    assert not b.available()
    now[0] = 10.0
    assert b.state == HALF_OPEN and b.available()
    b.acquire()                     # the one probe
    assert not b.available()
    b.failure()                     # the probe failed: open again for open_s
    assert b.state == OPEN
    now[0] = 20.0
    b.acquire()
    b.success()
    assert b.state == CLOSED and b.available()
    assert seen == [OPEN, HALF_OPEN, OPEN, HALF_OPEN, CLOSED]


@pytest.mark.parametrize("n, percent, most_open", [(1, 50, 0), (2, 50, 1), (4, 50, 2),
                                                   (4, 100, 3), (3, 0, 0), (10, 10, 1)])
def test_the_panic_threshold_never_opens_every_breaker_of_a_pool(n, percent, most_open):
    """Every upstream of a pool failing without end: at most ``percent`` of the breakers
    open, never all of them; one that closes again makes room for another."""
    from types import SimpleNamespace

    from engine_advisor.service.proxy.state import may_open
    pool = [SimpleNamespace(breaker=CircuitBreaker(2, 10.0, clock=lambda: 0.0))
            for _ in range(n)]
    for u in pool:
        u.breaker.may_open = lambda: may_open(pool, percent / 100)
    for _ in range(5):
        for u in pool:
            u.breaker.failure()
    assert sum(u.breaker.state == OPEN for u in pool) == most_open
    if most_open:
        opened = next(u for u in pool if u.breaker.state == OPEN)
        opened.breaker.success()           # (a probe's success)
        closed = next(u for u in pool if u.breaker.state == CLOSED and u is not opened)
        closed.breaker.failure()           # its failures were counted: opens at once
        assert closed.breaker.state == OPEN
        assert sum(u.breaker.state == OPEN for u in pool) == most_open


# ----------------------------------------------------------------------------- pools file
@pytest.mark.parametrize("text, expect", [
    ("pools: [", "not valid YAML"),
    ("- a\n- b\n", "expected a mapping"),
    ("workload: {kv_bytes_per_token: 1}\n", "pools: Field required"),
    ("pools: {vllm: []}\nworkload: {kv_bytes_per_token: 1}\n", "no upstream configured"),
    ("pools: {trt: [{url: 'http://a:1', model: m}]}\nworkload: {kv_bytes_per_token: 1}\n",
     "pools.trt"),
    ("pools: {vllm: [{url: 'ftp://a', model: m}]}\nworkload: {kv_bytes_per_token: 1}\n",
     "pools.vllm.0.url"),
    ("pools: {vllm: [{url: 'http://user:secret@a:1', model: m}]}\n"
     "workload: {kv_bytes_per_token: 1}\n", "give the key as api_key"),
    ("pools: {vllm: [{url: 'http://a:1', model: m, dcp_size: 3}]}\n"
     "workload: {kv_bytes_per_token: 1}\n", "dcp_size: 3 does not divide workload.num_gpus 8"),
    ("pools: {vllm: [{url: 'http://a:1', model: m, name: x}, {url: 'http://b:1', model: m, "
     "name: x}]}\nworkload: {kv_bytes_per_token: 1}\n", "'x' is used twice"),
    ("pools: {vllm: [{url: 'http://a:1', model: m}]}\nworkload: {}\n",
     "exactly one of kv_bytes_per_token"),
    ("pools: {vllm: [{url: 'http://a:1', model: m}]}\n"
     "workload: {kv_bytes_per_token: 1, gpu: Z9}\n", "unknown GPU 'Z9'"),
    ("pools: {vllm: [{url: 'http://a:1', model: m, colour: red}]}\n"
     "workload: {kv_bytes_per_token: 1}\n", "pools.vllm.0.colour: Extra inputs"),
    ("pools: {vllm: [{url: 'http://a:1', model: m}]}\nworkload: {kv_bytes_per_token: 1}\n"
     "timeouts: {total_s: 0}\n", "timeouts.total_s"),
])
def test_bad_pools_files_name_the_field(text, expect):
    with pytest.raises(UpstreamsError) as info:
        parse_pools(text, "up.yaml")
    assert str(info.value).startswith("up.yaml: ")
    assert expect in str(info.value)


def test_pools_defaults_names_and_urls(tmp_path):
    cfg, sha = read(write(tmp_path, BASE))
    pools = Pools(cfg, [], "x", sha, 1)
    assert len(sha) == 64 and pools.kv_bytes_per_token == 27648
    assert [u.name for u in cfg.pools["vllm"]] == ["vllm-0"]
    assert cfg.pools["sglang"][0].base_url() == "http://127.0.0.1:2"     # a trailing /v1 goes
    assert cfg.timeouts.connect_s > 0 and cfg.retries.max_attempts == 3
    with pytest.raises(UpstreamsError, match="cannot read"):
        read(tmp_path / "missing.yaml")


# ----------------------------------------------------------------------------- decisions
def test_buckets_are_fine_near_the_crossover():
    for x in (1, 2, 3, 1000, 122_000, 130_000, 16_777_216):
        r = representative(bucket(x, 8), 8, 1 << 24)
        assert abs(r - x) / x <= 0.045
    assert bucket(100_000, 8) != bucket(130_000, 8)


@pytest.fixture(scope="module")
def loaded():
    m = default_model()
    return LoadedModel(m, {}, "test")


def _pools(tmp_path) -> Pools:
    cfg, sha = read(write(tmp_path, BASE))
    ups = [Upstream.create(e, spec, cfg) for e, specs in cfg.pools.items() for spec in specs]
    return Pools(cfg, ups, "x", sha, 7)


def test_decider_follows_the_model_and_caches(tmp_path, loaded):
    pools = _pools(tmp_path)
    assert set(pools.groups) == {("vllm", 1), ("sglang", 8)}
    d = Decider()
    out, batch = seedload.OUTPUT, seedload.BATCH           # the published benchmark's batch
    short = d.decide(loaded, pools, 65_536, out, batch)
    long = d.decide(loaded, pools, 204_800, out, batch)
    assert short.best == ("vllm", 1) and long.best == ("sglang", 8)
    assert long.predictions[("sglang", 8)].total_s < long.predictions[("vllm", 1)].total_s
    assert d.misses == 2
    d.decide(loaded, pools, 204_000, out, batch)                 # same bucket
    assert (d.hits, d.misses) == (1, 2)
    # at batch 1 the model keeps vLLM even at 200K
    assert d.decide(loaded, pools, 204_800, out, 1).best == ("vllm", 1)
    assert d.agree(loaded, pools, 1000, 60_000, out, batch).best == ("vllm", 1)
    assert d.agree(loaded, pools, 30_000, 400_000, out, batch) is None


def test_estimated_decisions_are_remembered_by_their_arguments_per_generation(tmp_path,
                                                                             loaded):
    pools = _pools(tmp_path)
    d = Decider()
    first = d.estimated(loaded, pools, 70_000, 5_000, 280_000, 2048, 64, True)
    misses = d.misses
    assert d.estimated(loaded, pools, 70_000, 5_000, 280_000, 2048, 64, True) is first
    assert d.misses == misses
    other = d.estimated(loaded, pools, 70_000, 5_000, 280_000, 2048, 64, False)
    assert other[0] is first[0] and other[1] is False        # same buckets, no check asked
    newer = Pools(pools.config, pools.upstreams, "x", pools.sha256, pools.generation + 1)
    again = d.estimated(loaded, newer, 70_000, 5_000, 280_000, 2048, 64, True)
    assert again[0] is not first[0] and again == first and d.misses > misses
    assert first[0] == d.decide(loaded, pools, 70_000, 2048, 64)


# ----------------------------------------------------------------------------- framing
def test_event_end_and_retry_after():
    assert event_end(b"data: {}\n\ndata: {\"a\"") == len(b"data: {}\n\n")
    assert event_end(b"data: {}") == 0
    assert event_end(b"data: 1\r\n\r\n") == len(b"data: 1\r\n\r\n")
    assert retry_after("2") == 2.0 and retry_after("0.5") == 0.5
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None and retry_after(None) is None


def test_only_a_final_done_event_ends_a_stream():
    assert ends_with_done(b"data: [DONE]\n\n")
    assert ends_with_done(b'data: {"choices":[]}\n\ndata: [DONE]\n\n')
    assert ends_with_done(b'data: {"x":1}\r\n\r\ndata: [DONE]\r\n\r\n')
    # a token whose text is "data: [DONE]" is not the end of the stream
    assert not ends_with_done(b'data: {"choices":[{"text":"data: [DONE]"}]}\n\n')
    assert not ends_with_done(b'data: {"t":"\\ndata: [DONE]"}\n\n')
    assert not ends_with_done(b"data: [DONE]\n\ndata: {\"late\":1}\n\n")
    assert not ends_with_done(b"")


def test_request_parsing():
    r = parse(b'{"model":"m","messages":[{"role":"user","content":"h\\u00e9llo"}],'
              b'"max_completion_tokens":5,"stream":true}', CHAT)
    assert (r.model, r.stream, r.max_tokens, r.prompt_bytes) == ("m", True, 5, 6)
    r = parse(b'{"model":"m","prompt":[1,2,3]}', COMPLETIONS)
    assert (r.prompt_token_ids, r.max_tokens, r.stream) == (3, None, False)
    r = parse(b'{"prompt":["abcd"]}', COMPLETIONS)
    assert (r.prompt_token_ids, r.prompt_bytes, r.prompt_text()) == (None, 4, "abcd")
    for raw, path, param in ((b"[]", CHAT, None), (b'{"messages":[]}', CHAT, "messages"),
                             (b'{"prompt":{}}', COMPLETIONS, "prompt"),
                             (b'{"prompt":"x","max_tokens":true}', COMPLETIONS, "max_tokens"),
                             (b'{"prompt":"x","stream":"yes"}', COMPLETIONS, "stream"),
                             (b'{"prompt":"x","model":3}', COMPLETIONS, "model")):
        with pytest.raises(ApiError) as info:
            parse(raw, path)
        assert info.value.status == 400 and info.value.param == param


# ----------------------------------------------------------------------------- the app
def test_without_upstreams_the_proxy_answers_503_and_the_rest_works():
    with TestClient(create_app(Settings(_env_file=None)), raise_server_exceptions=False) as c:
        for method, path in (("post", "/v1/chat/completions"), ("post", "/v1/completions"),
                             ("get", "/v1/models"), ("post", "/v1/route")):
            r = getattr(c, method)(path, **({"json": {"model": "m"}} if method == "post"
                                             else {}))
            assert_error(r, 503, contains="--upstreams FILE")
        assert c.post("/v1/recommend", json={"context_tokens": 1000, "output_tokens": 10,
                                             "kv_bytes_per_token": 70272}).status_code == 200


def test_proxy_body_cap_is_separate(tmp_path):
    app = create_app(Settings(_env_file=None, proxy_max_body_bytes=1000, max_body_bytes=5000))
    with TestClient(app, raise_server_exceptions=False) as c:
        body = {"model": "m", "prompt": "a" * 2000}
        assert_error(c.post("/v1/completions", json=body), 413, contains="limit is 1,000")
        assert_error(c.post("/v1/route", json=body), 413)
        r = c.post("/v1/recommend", json={"context_tokens": 1000, "output_tokens": 10,
                                          "kv_bytes_per_token": 70272, "model": "a" * 2000})
        assert r.status_code != 413
    # default: at least 32 MiB, more when the pools serve longer contexts
    doc = {**BASE, "pools": {"vllm": [{"url": "http://127.0.0.1:1", "model": "m",
                                       "max_model_len": 4_194_304},
                                      {"url": "http://127.0.0.1:2", "model": "n"}]}}
    app = create_app(Settings(_env_file=None, upstreams=write(tmp_path, doc)))
    with TestClient(app) as c:
        assert app.state.proxy.body_cap() == 4_194_304 * 16
        cards = {m["id"]: m["max_model_len"] for m in c.get("/v1/models").json()["data"]}
        assert cards == {"m": 4_194_304, "n": None}
    assert create_app(Settings(_env_file=None)).state.proxy.body_cap() == 32 << 20


def test_the_entrance_keeps_request_ids_metrics_and_the_error_envelope(tmp_path, caplog,
                                                                       monkeypatch):
    """The completion routes bypass FastAPI (engine_advisor.service.main.App): its layers' duties
    still hold."""
    from engine_advisor.service.proxy import entrance
    app = create_app(Settings(_env_file=None, upstreams=write(tmp_path, BASE)))
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/completions", json={"model": "m", "prompt": 5},
                   headers={"x-request-id": "abc-123"})
        assert_error(r, 400, param="prompt")
        assert r.headers["x-request-id"] == "abc-123"
        r = c.post("/v1/chat/completions", content=b"{nope")
        assert_error(r, 400, contains="invalid JSON")
        assert len(r.headers["x-request-id"]) == 32            # created when not given

        def broken(raw, path):
            raise RuntimeError("boom")

        monkeypatch.setattr(entrance, "parse", broken)
        r = c.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        assert_error(r, 500, contains="internal error")
        assert "x-request-id" in r.headers
        assert "boom" in caplog.text                            # logged with its traceback
        metrics = c.get("/metrics").text
    for path, status in (("/v1/completions", 400), ("/v1/chat/completions", 400),
                         ("/v1/completions", 500)):
        assert (f'engine_advisor_http_requests_total{{method="POST",route="{path}",'
                f'status="{status}"}} 1.0') in metrics


def test_client_api_keys(tmp_path):
    doc = {**BASE, "client_api_keys": ["k-one", "k-two"]}
    app = create_app(Settings(_env_file=None, upstreams=write(tmp_path, doc)))
    with TestClient(app, raise_server_exceptions=False) as c:
        assert_error(c.get("/v1/models"), 401, param="authorization", contains="missing")
        assert_error(c.get("/v1/models", headers={"Authorization": "Bearer k-three"}), 401,
                     contains="invalid")
        r = c.get("/v1/models", headers={"Authorization": "Bearer k-two"})
        assert r.status_code == 200
        assert r.json()["data"][0]["engines"] == ["sglang", "vllm"]
        assert_error(c.post("/v1/route", json={"context_tokens": 5}), 401)


def test_file_watch_reloads_and_a_bad_file_keeps_the_pools(tmp_path):
    path = write(tmp_path, BASE)
    app = create_app(Settings(_env_file=None, upstreams=path, upstreams_watch_s=0.05,
                              admin_token="t"))
    auth = {"Authorization": "Bearer t"}

    def status(c):
        return c.get("/v1/upstreams", headers=auth).json()

    def wait(c, cond):
        wait_for(lambda: cond(status(c)), 5, 0.05)
        return status(c)

    with TestClient(app) as c:
        assert status(c)["generation"] == 1
        doc = yaml.safe_load(yaml.safe_dump(BASE))
        doc["pools"]["vllm"][0]["name"] = "renamed"
        path.write_text(yaml.safe_dump(doc))
        st = wait(c, lambda s: s["generation"] == 2)
        assert {u["name"] for u in st["upstreams"]} == {"renamed", "sglang-0"}
        assert st["last_reload"]["trigger"] == "file changed"
        path.write_text("pools: {}\n")
        st = wait(c, lambda s: s["last_reload"]["ok"] is False)
        assert "keeping the previous pools" in st["last_reload"]["message"]
        assert st["generation"] == 2 and len(st["upstreams"]) == 2
        metrics = c.get("/metrics").text
        assert 'engine_advisor_proxy_upstream_reloads_total{result="failed"} 1.0' in metrics


def test_local_tokenizer_counts_prompts(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[UNK]": 0, "alpha": 1, "beta": 2}
    tok = tokenizers.Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    doc = {**BASE, "tokens": {"tokenizer_file": "tokenizer.json"}}
    app = create_app(Settings(_env_file=None, upstreams=write(tmp_path, doc)))
    with TestClient(app, raise_server_exceptions=False) as c:
        # 72,000 bytes: plausibly 4,500-72,000 tokens, across BASE's crossover near 33K
        r = c.post("/v1/route", json={"model": "m", "prompt": "alpha beta gamma " * 4000
                                                                + "alpha " * 700})
        assert r.status_code == 200, r.text
        assert (r.json()["prompt_tokens"], r.json()["prompt_tokens_method"]) == (
            12_700, "tokenizer")
        r = c.post("/v1/route", json={"model": "m", "messages": [
            {"role": "system", "content": "alpha " * 6000},
            {"role": "user", "content": "beta " * 6000}]})
        assert r.json()["prompt_tokens"] == 12_000 + 2 * 4   # contents + template per message
        assert r.json()["prompt_tokens_method"] == "tokenizer"
        # 17,000 bytes: every plausible count (1,062-17,000) is routed alike: not tokenized
        r = c.post("/v1/route", json={"model": "m", "prompt": "alpha beta gamma " * 1000})
        assert (r.json()["prompt_tokens"], r.json()["prompt_tokens_method"]) == (
            4250, "estimate")


def test_a_prompt_of_kilobytes_is_tokenized_off_the_event_loop(tmp_path):
    """A tokenizer takes about 0.18 ms per KB: a 40 KB prompt whose decision depends on its
    count is tokenized in a worker thread, not on the event loop that serves every other
    request (at 64 KiB inline, 200 such prompts a second stalled the proxy for seconds)."""
    tokenizers = pytest.importorskip("tokenizers")
    import asyncio

    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = tokenizers.Tokenizer(WordLevel({"[UNK]": 0, "alpha": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    doc = {**BASE, "tokens": {"tokenizer_file": "tokenizer.json"}}
    app = create_app(Settings(_env_file=None, upstreams=write(tmp_path, doc)))
    on_loop: list[bool] = []

    class Watched:
        def encode(self, text, add_special_tokens=True):
            try:
                asyncio.get_running_loop()
                on_loop.append(True)
            except RuntimeError:
                on_loop.append(False)
            return tok.encode(text, add_special_tokens=add_special_tokens)

    # 40,800 bytes: plausibly 2,550-40,800 tokens, across BASE's crossover near 33K
    body = {"model": "m", "prompt": "alpha beta gamma " * 2400}
    with TestClient(app, raise_server_exceptions=False) as c:
        app.state.proxy.tokenizer = Watched()
        r = c.post("/v1/route", json=body)
        assert r.json()["prompt_tokens_method"] == "tokenizer", r.text
    assert on_loop == [False]


def test_counts_are_bounded_past_them_the_estimate_decides(tmp_path):
    """tokens.max_concurrent prompts are counted at once; one more whose decision depends on
    its count is routed by its estimate at once, and counted as skipped (a flood of long
    prompts must not queue for a tokenizer)."""
    tokenizers = pytest.importorskip("tokenizers")
    import threading

    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = tokenizers.Tokenizer(WordLevel({"[UNK]": 0, "alpha": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    doc = {**BASE, "tokens": {"tokenizer_file": "tokenizer.json", "max_concurrent": 1}}
    app = create_app(Settings(_env_file=None, upstreams=write(tmp_path, doc)))
    release = threading.Event()

    class Held:                           # the real tokenizer, once the test lets it go on
        def encode(self, text, add_special_tokens=True):
            assert release.wait(30)
            return tok.encode(text, add_special_tokens=add_special_tokens)

    # 72,000 bytes: plausibly 4,500-72,000 tokens, across BASE's crossover near 33K
    body = {"model": "m", "prompt": "alpha beta gamma " * 4000 + "alpha " * 700}
    with TestClient(app, raise_server_exceptions=False) as c:
        st = app.state.proxy
        st.tokenizer = Held()
        first: list = []
        t = threading.Thread(target=lambda: first.append(c.post("/v1/route", json=body)))
        t.start()
        try:
            deadline = time.monotonic() + 30
            while st.counting < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert st.counting == 1
            r = c.post("/v1/route", json=body)           # while the first is being counted
            assert (r.json()["prompt_tokens"], r.json()["prompt_tokens_method"]) == (
                18_050, "estimate")
        finally:
            release.set()
            t.join(30)
        assert first[0].json()["prompt_tokens_method"] == "tokenizer"
        assert st.counting == 0
        metrics = c.get("/metrics").text
        assert ('engine_advisor_proxy_prompt_token_counts_skipped_total{reason="busy"} 1.0'
                in metrics)


def test_serve_refuses_a_bad_pools_file(tmp_path):
    from engine_advisor.cli.main import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: {vllm: [{url: 'http://a:1'}]}\nworkload: {kv_bytes_per_token: 1}\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["serve", "--upstreams", str(bad)])
    assert code == 2
    assert err.getvalue().startswith("engine-advisor: error: --upstreams: ")
    assert "pools.vllm.0.model: Field required" in err.getvalue()


def test_request_bodies_decode_as_json_loads_does():
    """The proxy's fast decoding accepts and refuses what engine_advisor.model.jsontext.loads does
    (json.loads but for lone surrogates), with the same reasons."""
    from engine_advisor.model import jsontext
    from engine_advisor.service.proxy.request import decode
    for raw in (b'{"a":1}', b'{"a":1}  \n', b'{"a":1} x', b'{"a":', b"{", b'{"a":"\xff"}',
                b'{"a":1}{"b":2}', b' {"a":1}', b"[1]", b'{"a":"\\ud800"}', b"", b"nul",
                b'{"a":"\xed\xa0\x80"}', b'{"a":"\\ud83d\\ude00"}', b'{"\\udc00":1}',
                b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", b'{"a":' + b"7" * 5000 + b"}",
                b"[" * 100_000):
        try:
            want = ("ok", jsontext.loads(raw))
        except jsontext.BadJson as exc:
            want = ("error", str(exc))
        try:
            got = ("ok", decode(raw))
        except ApiError as exc:
            got = ("error", exc.message.removeprefix("request body: invalid JSON (")[:-1])
        assert got == want, raw


def test_new_request_ids_are_unique_safe_and_new_in_a_forked_child():
    import os

    from engine_advisor.service.middleware import SAFE_ID, request_id
    ids = [request_id(None) for _ in range(1000)]
    assert len(set(ids)) == 1000 and all(len(i) == 32 and SAFE_ID.fullmatch(i) for i in ids)
    assert request_id(b"abc-1") == b"abc-1" and request_id(b"a b") != b"a b"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child: its first new id
        os.write(w, request_id(None))
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(r, 64)
    os.close(r)
    os.close(w)
    assert child[:16] != ids[0][:16] and child not in ids


def test_passed_headers_are_filtered_and_checked():
    from engine_advisor.service.proxy.relay.passed import passed_lines
    from engine_advisor.service.transport.headers import header_lines
    assert passed_lines([(b"content-type", b"application/json"), (b"set-cookie", b"x"),
                         (b"retry-after", b"2")]) == \
        b"content-type: application/json\r\nretry-after: 2\r\n"
    for bad in (b"a\r\nset-cookie: x", b"a\nb", b"a\x00"):
        with pytest.raises(RuntimeError):
            passed_lines([(b"content-type", bad)])
        with pytest.raises(RuntimeError):
            header_lines([(b"x-a", bad)])
    with pytest.raises(RuntimeError):
        header_lines([(b"bad name", b"v")])
