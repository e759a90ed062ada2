"""What TensorRT-LLM (``trtllm-serve``, PyTorch backend) states about itself, as
``EngineFacts``: its start-up log, its JSON ``/metrics`` (iteration stats) and its Prometheus
``/prometheus/metrics`` (NVIDIA/TensorRT-LLM source; the engine cannot be installed here, so
the formats are the source's, not a log seen).

Start-up log (``tensorrt_llm/_torch/pyexecutor/_util.py``, the C++ KV cache manager,
``py_executor_creator.py``):

- "Memory used after loading model weights (inside torch) in memory usage profiling: W GiB",
  "Memory dynamically allocated during inference (inside torch) in memory usage profiling: A
  GiB", "Memory used outside torch (e.g., NCCL and CUDA graphs) in memory usage profiling: X
  GiB": weights, activation peak, non-torch memory;
- "Peak memory during memory usage profiling (torch + non-torch): P GiB, available KV cache
  memory when calculating max tokens: K GiB, fraction is set F, ... device total memory T
  GiB": the GPU's memory (F is TensorRT-LLM's share of the free memory, not the whole-GPU
  fraction the rows record: it is not taken as ``mem_fraction``);
- "[MemUsageChange] Allocated K GiB for max tokens in paged KV cache (N).": the KV cache's
  GiB and tokens (else "Estimated max memory in KV cache : K GiB");
- "Number of tokens per block: 32." and "... primary blocks=B ...": the block size and count;
- "max_seq_len=S, max_num_requests=R, max_num_tokens=T[, max_batch_size=R]" and "Adjusted
  max_seq_len to S" (a context cut to the cache): the context limit and the running-request
  limit (``--max_batch_size``, which it runs with as launched, its default 2048 stated as
  well);
- "TensorRT-LLM version: V" (the package's import banner) and "KV cache block reuse is
  enabled|disabled".

``/metrics``: the JSON list of iteration stats; each one's ``kvCacheStats`` gives
``maxNumBlocks`` x ``tokensPerBlock`` tokens, and ``maxBatchSizeStatic`` the running limit.
An idle server whose queue was drained answers ``[]``: nothing stated. ``/prometheus/metrics``:
``trtllm_kv_cache_max_blocks`` x ``trtllm_kv_cache_tokens_per_block``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine_advisor.calibration.sweep.engine_facts import EngineFacts, last_match
from engine_advisor.calibration.sweep.engine_jit import jit_events

_T = {
    "weights_gib": re.compile(r"Memory used after loading model weights \(inside torch\) in "
                              r"memory usage profiling: ([\d.]+) GiB"),
    "peak_activation_gib": re.compile(r"Memory dynamically allocated during inference \(inside "
                                      r"torch\) in memory usage profiling: ([\d.]+) GiB"),
    "non_torch_gib": re.compile(r"Memory used outside torch \(e\.g\., NCCL and CUDA graphs\) in "
                                r"memory usage profiling: ([\d.]+) GiB"),
    "gpu_total_gib": re.compile(r"Peak memory during memory usage profiling.*?device total "
                                r"memory ([\d.]+) GiB"),
    "allocated": re.compile(r"Allocated ([\d.]+) GiB for max tokens in paged KV cache "
                            r"\((\d+)\)"),
    "estimated": re.compile(r"Estimated max memory in KV cache : ([\d.]+) GiB"),
    "block_size": re.compile(r"Number of tokens per block: (\d+)|tokens per block=(\d+)"),
    "blocks": re.compile(r"primary blocks=(\d+)"),
    "limits": re.compile(r"max_seq_len=(\d+), max_num_requests=(\d+), max_num_tokens=(\d+)"),
    "adjusted": re.compile(r"Adjusted max_seq_len to (\d+)"),
    "version": re.compile(r"TensorRT-LLM version: ([\w.+-]+)"),
    "reuse": re.compile(r"KV cache block reuse is (enabled|disabled)"),
}


def parse_trtllm_log(text: str, source: str = "log") -> EngineFacts:
    f = EngineFacts()
    for name in ("weights_gib", "peak_activation_gib", "non_torch_gib", "gpu_total_gib"):
        if m := last_match(_T[name], text):
            f._set(name, float(m[1]), source)
    if m := last_match(_T["allocated"], text):
        f._set("kv_cache_gib", float(m[1]), source)
        f._set("kv_capacity_tokens", int(m[2]), source)
    elif m := last_match(_T["estimated"], text):
        f._set("kv_cache_gib", float(m[1]), source)
    if m := last_match(_T["block_size"], text):
        f._set("block_size", int(m[1] or m[2]), source)
    if m := last_match(_T["blocks"], text):
        f._set("num_gpu_blocks", int(m[1]), source)
    if m := last_match(_T["limits"], text):
        f._set("max_model_len", int(m[1]), source)
        # --max_batch_size as launched (the default, 2048, when not given): it runs with it
        f._set("max_running", int(m[2]), source)
        f._set("max_running_requested", int(m[2]), source)
    if m := last_match(_T["adjusted"], text):        # the context cut to what the cache holds
        f._set("max_model_len", int(m[1]), source)
    if m := _T["version"].search(text):
        f._set("version", m[1], source)
    if m := last_match(_T["reuse"], text):
        f._set("prefix_caching", m[1] == "enabled", source)
    f.jit.extend(jit_events(text))
    return f


def _count(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0 or v != int(v):
        return None
    return int(v)


def parse_iteration_stats(text: str, source: str = "metrics") -> EngineFacts | None:
    """The facts of a JSON ``/metrics`` answer (the last iteration's), or None when ``text`` is
    not a JSON list (a Prometheus page)."""
    if not text.lstrip().startswith("["):
        return None
    try:
        stats = json.loads(text)
    except json.JSONDecodeError:
        return None
    f = EngineFacts()
    last = next((s for s in reversed(stats) if isinstance(s, dict)), None) \
        if isinstance(stats, list) else None
    if last is None:
        return f
    kv = last.get("kvCacheStats")
    if isinstance(kv, dict):
        blocks, size = _count(kv.get("maxNumBlocks")), _count(kv.get("tokensPerBlock"))
        f._set("num_gpu_blocks", blocks, source)
        f._set("block_size", size, source)
        f._set("kv_capacity_tokens", blocks * size if blocks and size else None, source)
    f._set("max_running", _count(last.get("maxBatchSizeStatic")), source)
    return f


def prometheus_facts(samples: list[tuple[str, dict[str, str], float]],
                     source: str = "metrics") -> EngineFacts:
    """``trtllm_kv_cache_max_blocks`` x ``trtllm_kv_cache_tokens_per_block`` (the first
    sample of each) and ``trtllm_max_batch_size_static``."""
    first: dict[str, float] = {}
    for name, _, value in samples:
        if name.startswith("trtllm_"):
            first.setdefault(name, value)
    f = EngineFacts()
    blocks = _count(first.get("trtllm_kv_cache_max_blocks"))
    size = _count(first.get("trtllm_kv_cache_tokens_per_block"))
    f._set("num_gpu_blocks", blocks, source)
    f._set("block_size", size, source)
    f._set("kv_capacity_tokens", blocks * size if blocks and size else None, source)
    f._set("max_running", _count(first.get("trtllm_max_batch_size_static")), source)
    return f
