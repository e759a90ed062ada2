"""A bounded soak (bench/soak.py with 2,000 requests per phase instead of 20,000): the proxy
in front of simulators and /v1/recommend at concurrency 64 answer every request, and the
service's resident memory, file descriptors and threads do not grow."""

from __future__ import annotations

import pytest
from rel_helpers import load_soak

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_bounded_soak_no_errors_no_growth():
    res = load_soak().run(2000, 64)
    print(f"\nsoak: {res}")
    for phase in ("proxy", "recommend"):
        r = res[phase]
        assert r["errors"] == 0 and r["completed"] == 2000, r["error_samples"]
        assert r["rss_growth_pct"] < 10, r["rss_readings_mib"]
        assert len(r["rss_readings_mib"]) == 20
        # client connections are gone again; what stays is the proxy's bounded upstream pool
        assert r["fds_after"] <= r["fds_before"] + 64 + 8, r
        assert r["threads_after"] <= r["threads_before"] + 2, r
        assert 0 < r["p50_ms"] <= r["p99_ms"]
    assert res["proxy"]["stream_ttft_p99_ms"] is not None
    # the second phase starts from the first's descriptors: nothing leaked in between
    assert res["recommend"]["fds_after"] <= res["proxy"]["fds_after"] + 8
