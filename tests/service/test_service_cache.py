"""The response cache: bounded LRU, fixed-size keys, off at size 0."""

from __future__ import annotations

from svc_helpers import SEED, make_client

from engine_advisor.service.cache import ResponseCache, cache_key


def test_lru_eviction_and_counts():
    c = ResponseCache(2)
    c.put(("v", b"a"), (b"A", ()))
    c.put(("v", b"b"), (b"B", ()))
    assert c.get(("v", b"a")) == (b"A", ())  # a is now the most recent
    c.put(("v", b"c"), (b"C", ()))           # evicts b
    assert c.get(("v", b"b")) is None
    assert c.get(("v", b"c")) == (b"C", ()) and len(c) == 2
    assert (c.hits, c.misses) == (2, 1)
    assert c.get(("other-version", b"a")) is None


def test_size_zero_disables():
    c = ResponseCache(0)
    c.put(("v", b"a"), (b"A", ()))
    assert c.get(("v", b"a")) is None and len(c) == 0


def test_keys_are_fixed_size():
    assert len(cache_key(b"x")) == len(cache_key(b"x" * 1_000_000)) == 20
    assert cache_key(b"a") != cache_key(b"b")


def test_service_without_cache_gives_the_same_answers():
    with make_client(recommend_cache_size=0) as off, make_client() as on:
        for _ in range(2):
            a = off.post("/v1/recommend", json=SEED)
            b = on.post("/v1/recommend", json=SEED)
            assert a.status_code == b.status_code == 200 and a.content == b.content
        assert len(off.app.state.recommend_cache) == 0
        assert on.app.state.recommend_cache.hits == 1
