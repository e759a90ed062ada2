"""Warnings for times measured against ``engine-advisor sim`` that its overhead dominates.

The simulator reports its measured per-request and per-streamed-token overhead (wall seconds)
in ``/sim/info`` and, for SGLang, in ``/server_info`` under ``simulator`` (so SGLang
``bench_serving`` files carry it). A measured time below ``faithful_multiple`` times that
overhead, multiplied by the requests in flight (their exchanges share the same cores), is
mostly overhead: raise ``--time-scale``.
"""

from __future__ import annotations

from typing import Any

from engine_advisor.model.fit.dataset import Measurement


def resolution_of(server_info: Any) -> dict[str, Any] | None:
    """The simulator's ``time_resolution`` block from its /sim/info or SGLang /server_info
    answer, or None (a real engine, or not measured)."""
    if not isinstance(server_info, dict):
        return None
    res = server_info.get("time_resolution")
    if res is None and isinstance(server_info.get("simulator"), dict):
        res = server_info["simulator"].get("time_resolution")
    if not isinstance(res, dict):
        return None
    keys = ("request_overhead_s", "token_overhead_s", "faithful_multiple")
    if not all(isinstance(res.get(k), int | float) and res[k] >= 0 for k in keys):
        return None
    return res


def overhead_warnings(row: Measurement, res: dict[str, Any]) -> list[str]:
    """Why ``row``'s times are not faithful measurements of the simulator (empty: they are)."""
    k = res["faithful_multiple"]
    per_request = res["request_overhead_s"] * row.batch_size
    per_token = res["token_overhead_s"] * row.batch_size
    out = []
    for name, value, overhead, unit in (("TTFT", row.ttft_s, per_request, "request"),
                                        ("total", row.total_s, per_request, "request"),
                                        ("TPOT", row.tpot_s, per_token, "streamed token")):
        if value is not None and value < k * overhead:
            out.append(f"{name} {value * 1e3:.3g} ms is within {k}x the simulator's overhead of "
                       f"{overhead * 1e3:.3g} ms per {unit} at {row.batch_size} in flight: it "
                       "measures mostly that overhead (raise the simulator's --time-scale)")
    return out
