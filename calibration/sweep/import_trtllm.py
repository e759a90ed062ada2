"""TensorRT-LLM's benchmark files, as the result objects ``importers.entry_to_row`` reads.

- ``trtllm-serving``: the JSON TensorRT-LLM's ``benchmark_serving``
  (``tensorrt_llm/serve/scripts/benchmark_serving.py``, a fork of vLLM's) saves with
  ``--save-result``: vLLM's keys (``duration``, ``completed``, ``total_input_tokens``,
  ``mean_/median_/p99_{ttft,tpot,itl,e2el}_ms``, per request ``input_lens``, ``output_lens``,
  ``ttfts``, ``itls``, ``errors``) plus ``e2els`` and ``user_throughput``; its ``backend`` is
  ``openai``, so the engine is ``trtllm`` unless ``--engine`` says otherwise. Read as-is.
- ``trtllm-bench``: the report ``trtllm-bench ... throughput|latency --report_json FILE`` writes
  (``tensorrt_llm/bench/dataclasses/reporting.py``): ``engine`` (``model``, ``version``),
  ``world_info`` (``tp_size``, ``max_batch_size``, ``kv_cache_percentage`` ...),
  ``request_info`` (``num_requests``, ``avg_input_length``, ``avg_output_length``),
  ``performance`` (``total_latency_ms`` ...) and, for a streaming run, ``streaming_metrics``
  (``avg_ttft_ms``, ``avg_tpot_ms``, ``ttft_percentiles`` and ``tpot_percentiles``, in ms,
  with ``p50``, ``p95``, ``p99``, ``minimum``, ``maximum``, ``average``). No per-request arrays.

A ``trtllm-bench`` report becomes one row: ``duration`` its total latency; the requests were
all issued at once (``throughput`` without ``--concurrency``; ``latency``: one at a time, give
``--batch-size 1``), so the batch is the requests when they fit ``max_batch_size`` at once (one
wave: the batch's TTFT its p99 TTFT, the last first token for fewer than 100 requests), else
``--batch-size`` must say how many ran at once. ``tp_size`` and ``version`` fill the row;
``max_batch_size`` is the running-request limit as launched. ``kv_cache_percentage`` is
TensorRT-LLM's share of the free memory, not the whole-GPU fraction a row records, so
``--mem-fraction`` gives that (default 0.9).
"""

from __future__ import annotations

from typing import Any

FORMATS = ("trtllm-bench", "trtllm-serving")


class ReportError(ValueError):
    """A report field missing or of the wrong type: the message names it."""


def _section(obj: dict[str, Any], name: str) -> dict[str, Any]:
    v = obj.get(name)
    if not isinstance(v, dict):
        raise ReportError(f"field {name!r} must be an object (a trtllm-bench --report_json file)")
    return v


def _number(section: dict[str, Any], where: str, key: str, required: bool = True) -> float | None:
    v = section.get(key)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
        raise ReportError(f"field {where}.{key} must be a non-negative number, got {v!r}")
    return float(v)


def bench_report(obj: Any, batch_size: int | None) -> dict[str, Any]:
    """A ``trtllm-bench`` report as a result object of vLLM's keys (``importers.entry_to_row``);
    ``batch_size``: ``--batch-size``, when given."""
    if not isinstance(obj, dict):
        raise ReportError(f"expected a JSON object, got {type(obj).__name__}")
    engine, world = _section(obj, "engine"), _section(obj, "world_info")
    req, perf = _section(obj, "request_info"), _section(obj, "performance")
    n = _number(req, "request_info", "num_requests")
    if not n or n != int(n):
        raise ReportError(f"field request_info.num_requests must be a positive integer, got "
                          f"{req.get('num_requests')!r}")
    n = int(n)
    limit = _number(world, "world_info", "max_batch_size", required=False)
    if batch_size is None and limit is not None and n > limit:
        raise ReportError(f"{n} requests over max_batch_size {int(limit)}: several waves, the "
                          "requests in flight are not in the report; give --batch-size "
                          "(trtllm-bench's --concurrency, else max_batch_size)")
    out: dict[str, Any] = {
        "backend": "trtllm-bench", "completed": n, "num_prompts": n,
        "duration": _number(perf, "performance", "total_latency_ms") / 1e3,
        "random_input_len": max(1, round(_number(req, "request_info", "avg_input_length"))),
        "random_output_len": max(1, round(_number(req, "request_info", "avg_output_length"))),
        "request_rate": "inf", "max_concurrency": batch_size or n}
    if isinstance(engine.get("model"), str):
        out["model_id"] = engine["model"]
    info: dict[str, Any] = {}
    if world.get("tp_size") is not None:
        info["tp_size"] = world["tp_size"]
    if engine.get("version") is not None:
        info["version"] = str(engine["version"])
    if limit is not None:
        info["max_running_requests"] = int(limit)
    if info:
        out["server_info"] = info
    stream = obj.get("streaming_metrics")
    if isinstance(stream, dict):
        out["mean_tpot_ms"] = _number(stream, "streaming_metrics", "avg_tpot_ms")
        out["mean_ttft_ms"] = _number(stream, "streaming_metrics", "avg_ttft_ms")
        for name, key in (("ttft_percentiles", "p99_ttft_ms"),
                          ("tpot_percentiles", "median_itl_ms")):
            pct = stream.get(name)
            if isinstance(pct, dict):
                out[key] = _number(pct, f"streaming_metrics.{name}",
                                   "p99" if key.startswith("p99") else "p50")
    return out
