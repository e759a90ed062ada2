"""What a serving engine's HTTP endpoints state, as ``EngineFacts``.

- vLLM ``/metrics``: ``vllm:cache_config_info{...}`` labels (``kv_cache_size_tokens`` or
  ``num_gpu_blocks`` x ``block_size``, ``enable_prefix_caching``, ``gpu_memory_utilization``,
  ``kv_cache_max_concurrency``); SGLang ``/metrics`` (``--enable-metrics``):
  ``sglang:max_total_num_tokens``, and on a hybrid model the state pool's slots (free +
  evictable + in use: ``sglang:mamba_{available,evictable,used}_tokens``); TensorRT-LLM's
  JSON ``/metrics`` (iteration stats: ``kvCacheStats``) and ``/prometheus/metrics``
  (``trtllm_kv_cache_max_blocks`` x ``trtllm_kv_cache_tokens_per_block``);
- SGLang ``/get_server_info``: ``max_total_num_tokens``, ``chunked_prefill_size``,
  ``max_prefill_tokens``, ``disable_radix_cache``, ``load_format``, ``mem_fraction_static``,
  ``max_running_requests`` (the server argument: as launched), its scheduler's
  ``internal_states[0]``: ``effective_max_running_requests_per_dp`` (the limit it runs with)
  and ``max_mamba_cache_size`` (a hybrid model's state slots).
"""

from __future__ import annotations

import re
from typing import Any

from engine_advisor.calibration.sweep.engine_facts import EngineFacts, stated_bool
from engine_advisor.calibration.sweep.trtllm_facts import parse_iteration_stats, prometheus_facts


def parse_sglang_server_info(info: Any, source: str = "server_info") -> EngineFacts:
    """SGLang's ``/get_server_info`` (or ``/server_info``) answer."""
    f = EngineFacts()
    if not isinstance(info, dict):
        return f
    states = info.get("internal_states")
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) \
        else {}

    def positive(v: Any) -> int | None:
        if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0 or v != int(v):
            return None
        return int(v)

    def pos_int(key: str) -> int | None:
        return positive(info.get(key, state.get(key)))

    f._set("kv_capacity_tokens", pos_int("max_total_num_tokens"), source)
    # the server argument as launched (None: the default); the scheduler's state holds what it
    # runs with (per DP worker) and, on a hybrid model, the state pool's slots
    f._set("max_running_requested", positive(info.get("max_running_requests")), source)
    f._set("max_running", positive(state.get("effective_max_running_requests_per_dp",
                                             info.get("effective_max_running_requests_per_dp"))),
           source)
    f._set("state_slots", positive(state.get("max_mamba_cache_size")), source)
    f._set("chunk_tokens", pos_int("chunked_prefill_size"), source)
    f._set("max_prefill_tokens", pos_int("max_prefill_tokens"), source)
    f._set("max_model_len", pos_int("context_length"), source)
    if isinstance(info.get("disable_radix_cache"), bool):
        f._set("prefix_caching", not info["disable_radix_cache"], source)
    for name, key in (("load_format", "load_format"), ("kv_cache_dtype", "kv_cache_dtype"),
                      ("attention_backend", "attention_backend"), ("version", "version")):
        if isinstance(info.get(key), str) and info[key]:
            f._set(name, info[key], source)
    v = info.get("mem_fraction_static")
    if isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1:
        f._set("mem_fraction", float(v), source)
    return f


# What each engine's settings endpoint says, by engine name (an engine added to model/engines
# whose info_paths answer states settings gets its parser here)
SERVER_INFO_PARSERS = {"sglang": parse_sglang_server_info}


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        labels = {k: v.replace('\\"', '"') for k, v in _LABEL.findall(m["labels"] or "")}
        out.append((m["name"], labels, value))
    return out


# SGLang's state pool (hybrid models), in slots: free, evictable (radix-cached), in use
_SLOT_GAUGES = ("sglang:mamba_available_tokens", "sglang:mamba_evictable_tokens",
                "sglang:mamba_used_tokens")


def parse_metrics(text: str, source: str = "metrics") -> EngineFacts:
    """vLLM's ``vllm:cache_config_info`` labels; SGLang's ``sglang:max_total_num_tokens`` and a
    hybrid model's state slots (free + evictable + in use); TensorRT-LLM's JSON iteration stats
    or its Prometheus KV blocks (``engine_advisor.calibration.sweep.trtllm_facts``)."""
    stats = parse_iteration_stats(text, source)
    if stats is not None:
        return stats
    samples = metric_samples(text)
    f = prometheus_facts(samples, source)
    slots: dict[str, float] = {}
    for name, labels, value in samples:
        if name == "vllm:cache_config_info":
            def num(key: str, labels: dict[str, str] = labels) -> int | None:
                v = labels.get(key, "")
                return int(v) if v.isdigit() and int(v) > 0 else None
            blocks, size = num("num_gpu_blocks"), num("block_size")
            f._set("block_size", size, source)
            f._set("num_gpu_blocks", blocks, source)
            tokens = num("kv_cache_size_tokens") or (blocks * size if blocks and size else None)
            f._set("kv_capacity_tokens", tokens, source)
            f._set("prefix_caching", stated_bool(labels.get("enable_prefix_caching", "")), source)
            try:
                frac = float(labels.get("gpu_memory_utilization", ""))
                f._set("mem_fraction", frac if 0 < frac <= 1 else None, source)
            except ValueError:
                pass
            if labels.get("cache_dtype"):
                f._set("kv_cache_dtype", labels["cache_dtype"], source)
            try:
                conc = float(labels.get("kv_cache_max_concurrency", ""))
                f._set("max_concurrency", conc if conc > 0 else None, source)
            except ValueError:
                pass
        elif name in ("sglang:max_total_num_tokens", "sglang_max_total_num_tokens"):
            if value > 0:
                f._set("kv_capacity_tokens", int(value), source)
        elif (gauge := re.sub(r"^sglang_", "sglang:", name)) in _SLOT_GAUGES:
            slots.setdefault(gauge, value)          # the first sample (TP rank 0)
    if len(slots) == len(_SLOT_GAUGES) and sum(slots.values()) > 0:
        f._set("state_slots", int(sum(slots.values())), source)
    return f
