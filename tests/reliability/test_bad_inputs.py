"""The bad-input catalogue: malformed requests to every endpoint of a running service (proxy
on, in front of two simulators) and malformed command lines, each answered with the right
4xx (CLI: exit 2 and ``engine-advisor: error: ...``) and a message naming the problem; never
a 5xx, a traceback or a crash.

Each HTTP case: (id, method, path, body, headers, status, words). ``body`` is a Python value
sent as JSON (NaN and Infinity as Python's json writes them), or bytes sent as they are.
``words`` must all appear in the error message (case-insensitive); a word written ``=x``
must be the error's ``param`` instead.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess

import httpx
import pytest
from calib_helpers import BIN, REPO
from rel_helpers import AUTH, full_stack
from svc_helpers import SEED

pytestmark = pytest.mark.timeout(120)

NO_CTX = {k: v for k, v in SEED.items() if k != "context_tokens"}
PLAN = {"classes": [{"context_tokens": 65536, "output_tokens": 2048, "requests_per_second": 1}],
        "kv_bytes_per_token": 70272, "slo": {"max_tpot_s": 0.05}}
CHAT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMP = {"model": "kimi-k3", "prompt": "hi", "max_tokens": 4}
JSON_CT = {"content-type": "application/json"}


def w(**change):
    return {k: v for k, v in {**SEED, **change}.items() if v is not None}


R, B, P = "/v1/recommend", "/v1/recommend/batch", "/v1/predict"
X, PL, RL = "/v1/crossover", "/v1/plan", "/v1/model/reload"
C, CO, RT = "/v1/chat/completions", "/v1/completions", "/v1/route"

HTTP = [
    # --- wrong types, missing fields
    ("string-number", "POST", R, w(context_tokens="204800"), None, 422,
     ["=context_tokens", "integer", "string"]),
    ("bool-number", "POST", R, w(batch_size=True), None, 422, ["=batch_size", "boolean"]),
    ("missing-field", "POST", R, w(output_tokens=None), None, 422,
     ["=output_tokens", "required"]),
    ("unknown-field", "POST", R, w(contxt_tokens=5), None, 422, ["=contxt_tokens", "extra"]),
    ("list-body", "POST", R, [SEED], None, 422, ["=body", "object"]),
    ("null-body", "POST", R, None, None, 422, ["=body"]),
    ("nested-wrong-type", "POST", R, w(requirements={"lora": "maybe"}), None, 422,
     ["=requirements.lora", "boolean"]),
    ("custom-gpu-wrong-type", "POST", R,
     w(gpu={"name": "X", "memory_bytes": "lots", "hbm_bandwidth": 1e12}), None, 422,
     ["=gpu.memory_bytes", "number"]),
    # --- huge numbers, NaN/inf, negative sizes
    ("huge-context", "POST", R, w(context_tokens=10**30), None, 422,
     ["=context_tokens", "less than or equal"]),
    ("nan-context", "POST", R, w(context_tokens=float("nan")), None, 422,
     ["=context_tokens", "finite"]),
    ("inf-batch", "POST", R, w(batch_size=float("inf")), None, 422, ["=batch_size", "finite"]),
    ("negative-batch", "POST", R, w(batch_size=-64), None, 422,
     ["=batch_size", "greater than 0"]),
    ("negative-kv", "POST", R, w(kv_bytes_per_token=-1), None, 422, ["=kv_bytes_per_token"]),
    ("zero-gpus", "POST", R, w(num_gpus=0), None, 422, ["=num_gpus", "greater than 0"]),
    ("fractional-tokens", "POST", R, w(output_tokens=1.5), None, 422,
     ["=output_tokens", "fractional"]),
    ("inf-weights", "POST", R, w(model_weight_bytes=float("inf")), None, 422,
     ["=model_weight_bytes", "finite"]),
    # --- unknown engines, GPUs, presets; cross-field rules
    ("unknown-engine", "POST", R, w(engines=["lmdeploy"]), None, 422,
     ["=engines.0", "vllm", "sglang", "trtllm"]),
    ("unknown-gpu", "POST", R, w(gpu="A100X"), None, 422, ["=gpu", "unknown gpu"]),
    ("unknown-preset", "POST", R, w(preset="gpt-9"), None, 422,
     ["=preset", "unknown preset"]),
    ("two-kv-sources", "POST", R, w(kv_bytes_per_token=27648), None, 422, ["exactly one"]),
    ("dcp-not-dividing", "POST", R, w(dcp_sizes=[3]), None, 422,
     ["=dcp_sizes", "do not divide"]),
    ("bad-hf-config", "POST", R, w(preset=None, hf_config={"num_hidden_layers": "x"}),
     None, 422, ["hf_config", "num_hidden_layers"]),
    ("predict-unknown-engine", "POST", P, {"workload": SEED, "engine": "lmdeploy", "dcp_size": 1},
     None, 422, ["=engine", "vllm"]),
    ("predict-string-dcp", "POST", P, {"workload": SEED, "engine": "vllm", "dcp_size": "8"},
     None, 422, ["=dcp_size", "string"]),
    ("predict-missing-workload", "POST", P, {"engine": "vllm", "dcp_size": 1}, None, 422,
     ["=workload", "required"]),
    ("batch-empty", "POST", B, {"workloads": []}, None, 422, ["=workloads", "at least 1"]),
    ("batch-not-a-list", "POST", B, {"workloads": SEED}, None, 422, ["=workloads", "list"]),
    ("batch-too-many", "POST", B, {"workloads": [SEED] * 1001}, None, 422,
     ["workloads", "1000"]),
    ("crossover-with-context", "POST", X, SEED, None, 422,
     ["=context_tokens", "context_range"]),
    ("crossover-reversed-range", "POST", X, {**NO_CTX, "context_range": [50000, 1000]}, None,
     422, ["context_range", "below"]),
    ("crossover-too-many-points", "POST", X, {**NO_CTX, "points": [1024] * 300}, None, 422,
     ["=points", "at most 256"]),
    ("plan-empty-slo", "POST", PL, {**PLAN, "slo": {}}, None, 422, ["=slo", "max_tpot_s"]),
    ("plan-no-classes", "POST", PL, {**PLAN, "classes": []}, None, 422, ["=classes"]),
    ("plan-negative-rate", "POST", PL,
     {**PLAN, "classes": [{**PLAN["classes"][0], "requests_per_second": -1}]}, None, 422,
     ["=classes.0.requests_per_second", "greater than 0"]),
    # --- invalid JSON, wrong content type, oversized bodies
    ("invalid-json", "POST", R, b'{"context_tokens": ', JSON_CT, 400, ["invalid json"]),
    ("not-utf8", "POST", R, b'{"context_tokens": "\xff\xfe"}', JSON_CT, 400,
     ["invalid json", "decoded"]),
    ("nested-too-deep", "POST", P, b'{"workload": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
     JSON_CT, 400, ["invalid json", "nested too deeply"]),
    ("huge-integer", "POST", X, b'{"points": [' + b"1" * 4301 + b"]}", JSON_CT, 400,
     ["invalid json", "4,300 digits"]),
    ("lone-surrogate", "POST", PL, b'{"classes": [], "x": "\\udc00"}', JSON_CT, 400,
     ["invalid json", "lone surrogate"]),
    ("chat-nested-too-deep", "POST", C, b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
     JSON_CT, 400, ["invalid json", "nested too deeply"]),
    ("wrong-content-type", "POST", R, json.dumps(SEED).encode(), {"content-type": "text/plain"},
     422, ["=content-type", "application/json", "text/plain"]),
    ("oversized-body", "POST", R, b'{"pad": "' + b"x" * (2 << 20) + b'"}', JSON_CT, 413,
     ["too large", "1,048,576"]),
    ("lying-content-length", "POST", R, b"{}",
     {**JSON_CT, "content-length": str(10 << 20)}, 413, ["too large"]),
    ("proxy-oversized", "POST", CO, b'{"prompt": "' + b"x" * (33 << 20) + b'"}', JSON_CT, 413,
     ["too large"]),
    # --- path traversal and file arguments (reload loads only operator-allowed paths)
    ("reload-traversal", "POST", RL, {"path": "../../../etc/passwd"}, AUTH, 403,
     ["=path", "not allowed"]),
    ("reload-absolute", "POST", RL, {"path": "/etc/passwd"}, AUTH, 403, ["=path", "not allowed"]),
    ("reload-nul", "POST", RL, {"path": "good.json\x00.txt"}, AUTH, 422, ["=path", "nul"]),
    ("reload-directory", "POST", RL, {"path": "."}, AUTH, 403, ["=path", "not allowed"]),
    ("reload-missing-file", "POST", RL, {"path": "nope.json"}, AUTH, 422,
     ["=path", "no such file", "still serving"]),
    ("reload-wrong-type", "POST", RL, {"path": 5}, AUTH, 422, ["=path", "string"]),
    # --- proxy routes: OpenAI bodies, SSE-relevant fields
    ("chat-invalid-json", "POST", C, b"{not json", JSON_CT, 400, ["invalid json"]),
    ("chat-stream-yes", "POST", C, {**CHAT, "stream": "yes"}, None, 400,
     ["=stream", "true or false"]),
    ("chat-stream-options-without-stream", "POST", C,
     {**CHAT, "stream_options": {"include_usage": True}}, None, 400,
     ["=stream_options", "stream"]),
    ("chat-stream-options-not-object", "POST", C,
     {**CHAT, "stream": True, "stream_options": "usage"}, None, 400, ["=stream_options"]),
    ("chat-no-messages", "POST", C, {"model": "kimi-k3"}, None, 400, ["=messages"]),
    ("chat-empty-messages", "POST", C, {**CHAT, "messages": []}, None, 400,
     ["=messages", "non-empty"]),
    ("chat-negative-max-tokens", "POST", C, {**CHAT, "max_tokens": -5}, None, 400,
     ["=max_tokens", "positive integer"]),
    ("chat-string-max-tokens", "POST", C, {**CHAT, "max_tokens": "10"}, None, 400,
     ["=max_tokens"]),
    ("chat-model-not-string", "POST", C, {**CHAT, "model": 5}, None, 400, ["=model", "string"]),
    ("chat-unknown-model", "POST", C, {**CHAT, "model": "gpt-9"}, None, 404,
     ["=model", "not served"]),
    ("chat-body-array", "POST", C, [CHAT], None, 400, ["json object"]),
    ("completion-no-prompt", "POST", CO, {"model": "kimi-k3"}, None, 400,
     ["=prompt", "required"]),
    ("completion-prompt-object", "POST", CO, {**COMP, "prompt": {"text": "x"}}, None, 400,
     ["=prompt", "string"]),
    ("completion-prompt-bools", "POST", CO, {**COMP, "prompt": [True, False]}, None, 400,
     ["=prompt"]),
    ("completion-huge-max-tokens", "POST", CO, {**COMP, "max_tokens": 10**12}, None, 400,
     ["=max_tokens", "maximum context length"]),
    ("route-negative-context", "POST", RT, {"context_tokens": -1}, None, 422,
     ["=context_tokens", "greater than 0"]),
    ("route-bool-context", "POST", RT, {"context_tokens": True}, None, 422,
     ["=context_tokens", "boolean"]),
    # --- methods and paths
    ("wrong-method", "GET", R, None, None, 405, ["method not allowed"]),
    ("unknown-path", "GET", "/v1/nope", None, None, 404, ["not found"]),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with full_stack(tmp_path_factory.mktemp("badinputs")) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as h:
        yield h


def send(h: httpx.Client, method: str, path: str, body, headers) -> httpx.Response:
    headers = dict(headers or {})
    if "content-length" in headers:         # a lie httpx will not send: http.client does
        url = httpx.URL(str(h.base_url))
        conn = http.client.HTTPConnection(url.host, url.port, timeout=30)
        try:
            conn.putrequest(method, path)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders(body)
            r = conn.getresponse()
            return httpx.Response(r.status, headers=r.getheaders(), content=r.read())
        finally:
            conn.close()
    if isinstance(body, bytes):
        content = body
    elif body is None and method == "GET":
        content = None
    else:
        content = json.dumps(body).encode()
        headers.setdefault("content-type", "application/json")
    return h.request(method, path, content=content, headers=headers)


def check_error(r: httpx.Response, status: int, words: list[str]) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert b"Traceback" not in r.content and b'File "' not in r.content
    body = r.json()
    # an upstream's own 400 is passed through as it came: SGLang's flat form included
    err = body["error"] if "error" in body else body
    assert "error" in body or body.get("object") == "error", body
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert err["message"] and err["code"] in (status, str(status)), err
    for word in words:
        if word.startswith("="):
            assert err["param"] == word[1:], err
        else:
            assert word.lower() in err["message"].lower(), err
    return err


def test_the_catalogue_is_broad():
    assert len(HTTP) + len(CLI) >= 40
    assert {c[2] for c in HTTP} >= {R, B, P, X, PL, RL, C, CO, RT}


@pytest.mark.parametrize("case", HTTP, ids=[c[0] for c in HTTP])
def test_bad_http_input(stack, case):
    _, method, path, body, headers, status, words = case
    check_error(send(stack, method, path, body, headers), status, words)


# ------------------------------------------------------------------ the CLI
SEED_ARGS = ["--context-tokens", "65536", "--output-tokens", "2048", "--batch-size", "64",
             "--kv-bytes-per-token", "70272"]


def rec(*change: str) -> list[str]:
    """``recommend`` with SEED_ARGS, an option's value replaced (or added)."""
    args = list(SEED_ARGS)
    for flag, value in zip(change[::2], change[1::2], strict=True):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return ["recommend", *args]


# Relative paths that climb from the repository (the tests' working directory) to /etc,
# however deep the checkout lies.
UP_TO_ETC_PASSWD = os.path.relpath("/etc/passwd", REPO)
UP_TO_ETC = os.path.relpath("/etc", REPO)

CLI = [
    ("cli-negative-context", rec("--context-tokens", "-5"), ["context"]),
    ("cli-not-a-number", rec("--batch-size", "lots"), ["--batch-size", "lots"]),
    ("cli-nan", rec("--output-tokens", "nan"), ["--output-tokens"]),
    ("cli-huge", rec("--context-tokens", str(10**30)), ["--context-tokens", "less than"]),
    ("cli-unknown-gpu", rec("--gpu", "A100X"), ["unknown gpu"]),
    ("cli-unknown-engine", rec("--engines", "lmdeploy"),
     ["--engines", "vllm", "sglang", "trtllm"]),
    ("cli-model-traversal", rec("--model", UP_TO_ETC_PASSWD), ["not valid json",
                                                               "not an artifact"]),
    ("cli-model-directory", rec("--model", "/etc"), ["/etc", "is a directory"]),
    ("fit-directory-traversal", ["fit", "--out", "OUT/m.json", UP_TO_ETC],
     ["etc"]),
    ("fit-not-a-csv", ["fit", "--out", "OUT/m.json", "/etc/passwd"], ["passwd"]),
    ("serve-bad-upstreams", ["serve", "--port", "0", "--upstreams", "/etc/passwd"],
     ["--upstreams"]),
    ("serve-bad-port", ["serve", "--port", "70000"], ["port"]),
    ("sim-negative-scale", ["sim", "--time-scale", "-1"], ["time"]),
    ("calibrate-bad-contexts", ["calibrate", "run", "--engine", "vllm", "--url",
                                "http://127.0.0.1:9", "--contexts", "abc", "--out", "OUT/run"],
     ["contexts"]),
    ("calibrate-import-passwd", ["calibrate", "import", "--format", "vllm-bench",
                                 "--kv-bytes-per-token", "70272", "--out", "OUT/x.csv",
                                 "/etc/passwd"], ["passwd"]),
]


@pytest.mark.parametrize("case", CLI, ids=[c[0] for c in CLI])
def test_bad_command_line(case, tmp_path):
    _, args, words = case
    args = [a.replace("OUT", str(tmp_path)) for a in args]
    r = subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("engine-advisor: error: ") or ": error: " in last, r.stderr
    for word in words:
        assert word.lower() in r.stderr.lower(), r.stderr
    assert not list(tmp_path.iterdir()), "a refused command wrote files"
