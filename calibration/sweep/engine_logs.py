"""What an engine's start-up log states, as ``EngineFacts`` (the last start's, when a log holds
several).

vLLM: "Available KV cache memory: 95.16 GiB", "GPU KV cache size: 3,284,944 tokens", "Actual
usage is 29.34 GiB for weight, 1.09 GiB for peak activation, 0.23 GiB for non-torch memory, and
1.2 GiB for CUDAGraph memory", "max_num_batched_tokens=8192", "non-default args: {...
'max_num_seqs': 128 ...}", "Maximum concurrency for 262,144 tokens per request: 8.07x" and, on a
hybrid model, "Setting attention block size to 544 tokens to ensure that attention page size is
>= mamba page size.".

SGLang: "Load weight begin. avail mem=139.09 GB", "Load weight end ... mem usage=29.47 GB", "KV
Cache is allocated ... #tokens: 3303934, KV size: 95.71 GB", "max_total_num_tokens=...,
chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=66, ...",
"server_args=ServerArgs(... max_running_requests=None ...)" and, on a hybrid model, "Mamba Cache
is allocated. max_mamba_cache_size: 330, conv_state size: 0.55GB, ssm_state size: 23.27GB".
SGLang's "GB" are GiB (it divides by 2**30).

TensorRT-LLM: ``engine_advisor.calibration.sweep.trtllm_facts``.

Every log's JIT compiles go to ``EngineFacts.jit``
(``engine_advisor.calibration.sweep.engine_jit``).
"""

from __future__ import annotations

import re

from engine_advisor.calibration.sweep.engine_facts import EngineFacts, last_match, stated_bool
from engine_advisor.calibration.sweep.engine_jit import jit_events
from engine_advisor.calibration.sweep.trtllm_facts import parse_trtllm_log


def _num(text: str) -> float:
    return float(text.replace(",", ""))


# ----------------------------------------------------------------------------- vLLM
_V = {
    "kv_cache_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "kv_capacity_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "usage": re.compile(r"Actual usage is (.*?)\.(?:\s|$)", re.MULTILINE),
    "free": re.compile(r"Free memory on device \(([\d.]+)/([\d.]+) GiB\)"),
    "chunk_tokens": re.compile(r"max_num_batched_tokens=(\d+)"),
    "weights_loaded": re.compile(r"Model loading took ([\d.]+) GiB"),
    "attention_backend": re.compile(r"Using (\w+) attention backend"),
    "moe_backend": re.compile(r"Using (\w+) Unquantized MoE backend|Using (\w+) MoE backend"),
    "version": re.compile(r"LLM engine \(v([\w.+-]+)\)|version (\d[\w.+-]*)"),
    "load_format": re.compile(r"(?<![\w'])load_format[=':\s]+'?(\w+)"),
    "prefix_caching": re.compile(r"enable_prefix_caching[=':\s]+'?(True|False)"),
    "kv_cache_dtype": re.compile(r"(?<!\w)kv_cache_dtype=(\w+)|cache_dtype='?(\w+)"),
    "max_model_len": re.compile(r"max_seq_len=(\d+)|Using max model len (\d+)"),
    "mem_fraction": re.compile(r"Desired GPU memory utilization is \(([\d.]+)|"
                               r"'gpu_memory_utilization': ([\d.]+)"),
    # a hybrid model's attention blocks, raised to hold a Mamba page; else the backend's block
    "block_size": re.compile(r"Setting attention block size to (\d+) tokens|"
                             r"Setting kv cache block size to (\d+) for"),
    "max_concurrency": re.compile(r"Maximum concurrency for [\d,]+ tokens per request: "
                                  r"([\d.]+)x"),
    "max_num_seqs": re.compile(r"non-default args: \{.*?'max_num_seqs': (\d+)"),
}
_USAGE_PART = re.compile(r"([\d.]+) GiB for ([A-Za-z][\w-]*(?: [A-Za-z][\w-]*)?)")
_USAGE_NAMES = {"weight": "weights_gib", "peak activation": "peak_activation_gib",
                "non-torch": "non_torch_gib", "cudagraph": "cuda_graph_gib"}


def parse_vllm_log(text: str, source: str = "log") -> EngineFacts:
    f = EngineFacts()
    for name in ("kv_cache_gib", "chunk_tokens", "kv_capacity_tokens"):
        m = last_match(_V[name], text)
        if m:
            v = _num(m[1])
            f._set(name, v if name == "kv_cache_gib" else int(v), source)
    m = last_match(_V["usage"], text)
    if m:
        for value, what in _USAGE_PART.findall(m[1]):
            name = _USAGE_NAMES.get(what.lower().removesuffix(" memory"))
            if name:
                f._set(name, float(value), source)
    if f.weights_gib is None and (m := last_match(_V["weights_loaded"], text)):
        f._set("weights_gib", float(m[1]), source)
    if m := last_match(_V["free"], text):
        f._set("free_at_start_gib", float(m[1]), source)
        f._set("gpu_total_gib", float(m[2]), source)
    for name in ("attention_backend", "moe_backend", "version", "load_format", "kv_cache_dtype"):
        m = _V[name].search(text)
        if m:
            f._set(name, next(g for g in m.groups() if g is not None), source)
    if m := _V["prefix_caching"].search(text):
        f._set("prefix_caching", stated_bool(m[1]), source)
    if m := _V["max_model_len"].search(text):
        f._set("max_model_len", int(next(g for g in m.groups() if g)), source)
    if m := _V["mem_fraction"].search(text):
        f._set("mem_fraction", float(next(g for g in m.groups() if g)), source)
    if m := last_match(_V["block_size"], text):
        f._set("block_size", int(next(g for g in m.groups() if g)), source)
    if m := last_match(_V["max_concurrency"], text):
        f._set("max_concurrency", float(m[1]), source)
    # the launch's --max-num-seqs, which vLLM runs with; its default is not logged (None)
    if m := last_match(_V["max_num_seqs"], text):
        f._set("max_running_requested", int(m[1]), source)
        f._set("max_running", int(m[1]), source)
    f.jit.extend(jit_events(text))
    return f


# ----------------------------------------------------------------------------- SGLang
_S = {
    "free_at_start_gib": re.compile(r"Load weight begin\. avail mem=([\d.]+) GB"),
    "weights_gib": re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB"),
    "kv": re.compile(r"KV Cache is allocated\.(.*)"),
    "free_after_pool_gib": re.compile(r"Memory pool end\. avail mem=([\d.]+) GB"),
    "graph": re.compile(r"CUDA graph end\..*?mem usage=([\d.]+) GB"),
    "summary": re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), "
                          r"max_prefill_tokens=(\d+)(?:.*?context_len=(\d+))?"),
    "attention_backend": re.compile(r"(?<![\w])attention_backend='(\w+)'|Use (\w+) backend by "
                                    r"default"),
    "load_format": re.compile(r"(?<![\w])load_format='(\w+)'"),
    "mem_fraction": re.compile(r"(?<![\w])mem_fraction_static=([\d.]+)"),
    "radix": re.compile(r"(?<![\w])disable_radix_cache=(True|False)"),
    "kv_cache_dtype": re.compile(r"(?<![\w])kv_cache_dtype='(\w+)'"),
    # the scheduler's limit (the request, or what the KV and state pools hold, per DP worker)
    "max_running": re.compile(r"max_total_num_tokens=\d+, .*?(?<![\w])max_running_requests=(\d+)"),
    "requested": re.compile(r"ServerArgs\(.*?(?<![\w])max_running_requests=(None|\d+)"),
    "reduced": re.compile(r"max_running_requests was reduced from the requested (\d+) to (\d+)"),
    "mamba": re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+),(.*)"),
}


def parse_sglang_log(text: str, source: str = "log") -> EngineFacts:
    f = EngineFacts()
    for name in ("free_at_start_gib", "weights_gib", "free_after_pool_gib"):
        if m := last_match(_S[name], text):
            f._set(name, float(m[1]), source)
    if m := last_match(_S["kv"], text):
        rest = m[1]
        if t := re.search(r"#tokens: (\d+)", rest):
            f._set("kv_capacity_tokens", int(t[1]), source)
        sizes = re.findall(r"\b(?:KV|K|V) size: ([\d.]+) GB", rest)
        if sizes:
            f._set("kv_cache_gib", round(sum(map(float, sizes)), 4), source)
    start = text.rfind("Load weight begin")     # graphs of the last start only
    graphs = [float(g) for g in _S["graph"].findall(text[max(start, 0):])]
    if graphs:
        f._set("cuda_graph_gib", round(sum(graphs), 4), source)
    if m := last_match(_S["summary"], text):
        f._set("kv_capacity_tokens", int(m[1]), source)
        chunk = int(m[2])
        f._set("chunk_tokens", chunk if chunk > 0 else None, source)
        f._set("max_prefill_tokens", int(m[3]), source)
        if m[4]:
            f._set("max_model_len", int(m[4]), source)
    for name in ("attention_backend", "load_format", "kv_cache_dtype"):
        if m := _S[name].search(text):
            f._set(name, next(g for g in m.groups() if g is not None), source)
    if m := _S["mem_fraction"].search(text):
        f._set("mem_fraction", float(m[1]), source)
    if m := _S["radix"].search(text):
        f._set("prefix_caching", not stated_bool(m[1]), source)
    if m := last_match(_S["mamba"], text):
        f._set("state_slots", int(m[1]), source)
        # conv_state and ssm_state (and, with speculative decoding, the intermediate caches)
        sizes = re.findall(r"\b\w+ size: ([\d.]+) ?GB", m[2])
        if sizes:
            f._set("state_pool_gib", round(sum(map(float, sizes)), 4), source)
    reduced = last_match(_S["reduced"], text)
    if m := last_match(_S["requested"], text):       # None: not given (the engine's default)
        f._set("max_running_requested", None if m[1] == "None" else int(m[1]), source)
    elif reduced:
        f._set("max_running_requested", int(reduced[1]), source)
    if m := last_match(_S["max_running"], text):
        f._set("max_running", int(m[1]), source)
    elif reduced:
        f._set("max_running", int(reduced[2]), source)
    f.jit.extend(jit_events(text))
    return f


def parse_log(engine: str, text: str, source: str = "log") -> EngineFacts:
    if engine not in LOG_PARSERS:
        raise ValueError(f"unknown engine {engine!r}")
    return LOG_PARSERS[engine](text, source)


# What each engine's start-up log says, by engine name (an engine added to model/engines gets its
# parser here: its log lines are this job's knowledge, not the model's)
LOG_PARSERS = {"vllm": parse_vllm_log, "sglang": parse_sglang_log, "trtllm": parse_trtllm_log}
