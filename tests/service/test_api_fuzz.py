"""No input produces a 500: random mutations of valid bodies on every POST endpoint."""

from __future__ import annotations

import json
import random

from svc_helpers import SEED

NO_CTX = {k: v for k, v in SEED.items() if k != "context_tokens"}
VALID = {
    "/v1/recommend": SEED,
    "/v1/recommend/batch": {"workloads": [SEED, NO_CTX]},
    "/v1/predict": {"workload": SEED, "engine": "sglang", "dcp_size": 8},
    "/v1/crossover": NO_CTX,
    "/v1/plan": {"classes": [{"context_tokens": 65536, "output_tokens": 2048,
                              "requests_per_second": 1}], "kv_bytes_per_token": 70272,
                 "slo": {"max_tpot_s": 0.05}},
    "/v1/model/reload": {"path": "x"},
}
ODD = [None, True, -1, 0, 1, 2**63, 1e308, -1e-308, float("nan"), "", "x" * 300, [], {},
       [1, 2], {"a": 1}, "B300", "vllm", 8, 1.5, "../../etc/passwd", {"name": "X"}]


def mutate(rng: random.Random, value):
    if isinstance(value, dict) and value and rng.random() < 0.8:
        out = dict(value)
        key = rng.choice(list(out))
        action = rng.random()
        if action < 0.2:
            del out[key]
        elif action < 0.3:
            out[rng.choice(["zzz", "gpu", "hf_config", "requirements", "preset"])] = rng.choice(ODD)
        else:
            out[key] = mutate(rng, out[key])
        return out
    if isinstance(value, list) and value and rng.random() < 0.7:
        out = list(value)
        i = rng.randrange(len(out))
        out[i] = mutate(rng, out[i])
        return out
    if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.5:
        return rng.choice([value * 1000, value // 7, -value, 3, 1 << 24, 1 << 40])
    return rng.choice(ODD)


def post(client, path, body):
    """Python's JSON (NaN and Infinity included, which the server's parser also accepts)."""
    return client.post(path, content=json.dumps(body).encode(),
                       headers={"content-type": "application/json"})


def test_random_bodies_never_500(client):
    rng = random.Random(1234)
    seen = set()
    for _ in range(300):
        path = rng.choice(list(VALID))
        body = mutate(rng, VALID[path])
        if rng.random() < 0.5:
            body = mutate(rng, body)
        r = post(client, path, body)
        seen.add(r.status_code)
        assert r.status_code < 500, (path, body, r.text)
        if r.status_code >= 400:
            assert set(r.json()) == {"error"}
    assert 200 in seen and 422 in seen


def test_hf_config_garbage_never_500(client):
    configs = [{"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64},
               {"num_hidden_layers": "61"}, {"num_hidden_layers": 1e400},
               {"num_hidden_layers": 4, "num_attention_heads": 0, "hidden_size": 64},
               {"num_hidden_layers": 4, "num_key_value_heads": 3, "num_attention_heads": 8,
                "hidden_size": 256},
               {"layer_types": "full", "num_hidden_layers": 2}, {}]
    base = {k: v for k, v in SEED.items() if k != "kv_bytes_per_token"}
    for cfg in configs:
        r = post(client, "/v1/recommend", {**base, "hf_config": cfg})
        assert r.status_code in (200, 422), (cfg, r.text)
