"""What an engine says about itself: KV capacity, memory split, chunk size, prefix caching,
load format, backends, running-request limit, a hybrid model's state pool; and the JIT
compiles it reports while serving.

Sources, each parsed into an ``EngineFacts`` (only what the source states):

- vLLM ``/metrics``: ``vllm:cache_config_info{...}`` labels (``kv_cache_size_tokens`` or
  ``num_gpu_blocks`` x ``block_size``, ``enable_prefix_caching``, ``gpu_memory_utilization``,
  ``kv_cache_max_concurrency``); SGLang ``/metrics`` (``--enable-metrics``):
  ``sglang:max_total_num_tokens``, and on a hybrid model the state pool's slots (free +
  evictable + in use: ``sglang:mamba_{available,evictable,used}_tokens``);
- SGLang ``/get_server_info``: ``max_total_num_tokens``, ``chunked_prefill_size``,
  ``max_prefill_tokens``, ``disable_radix_cache``, ``load_format``, ``mem_fraction_static``,
  ``max_running_requests`` (the server argument: as launched), its scheduler's
  ``internal_states[0]``: ``effective_max_running_requests_per_dp`` (the limit it runs with)
  and ``max_mamba_cache_size`` (a hybrid model's state slots);
- the launch command (``--launch``): ``--load-format``, the engine's running-request flag
  (vLLM ``--max-num-seqs``, SGLang ``--max-running-requests``);
- start-up logs. vLLM: "Available KV cache memory: 95.16 GiB", "GPU KV cache size: 3,284,944
  tokens", "Actual usage is 29.34 GiB for weight, 1.09 GiB for peak activation, 0.23 GiB for
  non-torch memory, and 1.2 GiB for CUDAGraph memory", "max_num_batched_tokens=8192",
  "non-default args: {... 'max_num_seqs': 128 ...}", "Maximum concurrency for 262,144 tokens per
  request: 8.07x" and, on a hybrid model, "Setting attention block size to 544 tokens to ensure
  that attention page size is >= mamba page size.".
  SGLang: "Load weight begin. avail mem=139.09 GB", "Load weight end ... mem usage=29.47 GB",
  "KV Cache is allocated ... #tokens: 3303934, KV size: 95.71 GB", "max_total_num_tokens=...,
  chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=66, ...",
  "server_args=ServerArgs(... max_running_requests=None ...)" and, on a hybrid model, "Mamba
  Cache is allocated. max_mamba_cache_size: 330, conv_state size: 0.55GB, ssm_state size:
  23.27GB". SGLang's "GB" are GiB (it divides by 2**30), so every memory figure here is in GiB.

The running-request limit comes twice: ``max_running_requested`` as launched (None: the
engine's default) and ``max_running`` as the engine runs with it. vLLM runs with its
``--max-num-seqs`` and does not log its default (None when not given); SGLang may lower the
request to what its KV and state pools hold, and logs the result (per DP worker).

JIT: vLLM logs "Triton kernel JIT compilation during inference: <kernel>" with the log line's
time (``MM-DD HH:MM:SS``, the engine's local time, no year); ``jit_events`` finds them and
``LogTail`` reads a growing log from where it last stopped.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engine_advisor.calibration.errors import CalibrationError
from engine_advisor.model import engines

FACT_FIELDS = ("kv_capacity_tokens", "kv_cache_gib", "weights_gib", "peak_activation_gib",
               "non_torch_gib", "cuda_graph_gib", "gpu_total_gib", "free_at_start_gib",
               "free_after_pool_gib", "chunk_tokens", "max_prefill_tokens", "prefix_caching",
               "block_size", "num_gpu_blocks", "mem_fraction", "load_format", "kv_cache_dtype",
               "attention_backend", "moe_backend", "version", "max_model_len", "max_running",
               "max_running_requested", "state_slots", "state_pool_gib", "max_concurrency")


@dataclass(frozen=True)
class JitEvent:
    kernel: str
    log_time: str            # as the log prints it: "12-01 09:44:21" or "2026-12-01 09:44:21"
    line: str = ""

    def time(self, near: dt.datetime) -> dt.datetime | None:
        """The event's time as an aware datetime, reading the log's local time in ``near``'s
        time zone, the year (when the log omits it) the one that puts it closest to ``near``."""
        return log_time(self.log_time, near)

    def to_json(self) -> dict[str, str]:
        return {"kernel": self.kernel, "log_time": self.log_time}


@dataclass
class EngineFacts:
    """Facts one or more sources stated (None: not stated). Memory in GiB."""

    kv_capacity_tokens: int | None = None
    kv_cache_gib: float | None = None
    weights_gib: float | None = None
    peak_activation_gib: float | None = None
    non_torch_gib: float | None = None
    cuda_graph_gib: float | None = None
    gpu_total_gib: float | None = None
    free_at_start_gib: float | None = None
    free_after_pool_gib: float | None = None   # SGLang: left after weights and KV pool
    chunk_tokens: int | None = None            # prefill tokens per step (chunked prefill)
    max_prefill_tokens: int | None = None
    prefix_caching: bool | None = None
    block_size: int | None = None              # vLLM: tokens per KV block (a hybrid's attention)
    num_gpu_blocks: int | None = None
    mem_fraction: float | None = None
    load_format: str | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    moe_backend: str | None = None
    version: str | None = None
    max_model_len: int | None = None
    max_running: int | None = None             # running-request limit the engine runs with
    max_running_requested: int | None = None   # the limit as launched (None: the default)
    state_slots: int | None = None             # SGLang hybrid: the Mamba state pool's slots
    state_pool_gib: float | None = None        # SGLang hybrid: the state pool (conv + ssm)
    max_concurrency: float | None = None       # vLLM: requests of max_model_len the KV holds
    sources: dict[str, str] = field(default_factory=dict)   # fact -> where it came from
    jit: list[JitEvent] = field(default_factory=list)

    def _set(self, name: str, value: Any, source: str) -> None:
        if value is not None:
            setattr(self, name, value)
            self.sources[name] = source

    def merged(self, other: EngineFacts) -> EngineFacts:
        """These facts, with ``other``'s filling what these lack."""
        out = EngineFacts()
        for name in FACT_FIELDS:
            mine = getattr(self, name)
            if mine is not None:
                out._set(name, mine, self.sources.get(name, ""))
            else:
                out._set(name, getattr(other, name), other.sources.get(name, ""))
        seen = set()
        for ev in [*self.jit, *other.jit]:
            if (ev.kernel, ev.log_time) not in seen:
                seen.add((ev.kernel, ev.log_time))
                out.jit.append(ev)
        return out

    @property
    def empty(self) -> bool:
        return all(getattr(self, n) is None for n in FACT_FIELDS) and not self.jit

    @property
    def dummy_weights(self) -> bool | None:
        """True for ``--load-format dummy``, False for a checkpoint, None when not stated."""
        if self.load_format is None:
            return None
        return self.load_format.lower() == "dummy"

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {n: getattr(self, n) for n in FACT_FIELDS
                             if getattr(self, n) is not None}
        d["sources"] = dict(sorted(self.sources.items()))
        if self.jit:
            d["jit"] = [e.to_json() for e in self.jit]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> EngineFacts:
        out = cls()
        if not isinstance(d, dict):
            return out
        types = {f.name: f.type for f in fields(cls)}
        for name in FACT_FIELDS:
            v = d.get(name)
            if v is None:
                continue
            kind = types[name]
            ok = (("int" in kind and isinstance(v, int) and not isinstance(v, bool))
                  or ("float" in kind and isinstance(v, int | float) and not isinstance(v, bool))
                  or ("bool" in kind and isinstance(v, bool))
                  or ("str" in kind and isinstance(v, str)))
            if ok:
                out._set(name, v, str((d.get("sources") or {}).get(name, "manifest")))
        for e in d.get("jit") or []:
            if isinstance(e, dict) and isinstance(e.get("kernel"), str):
                out.jit.append(JitEvent(e["kernel"], str(e.get("log_time", ""))))
        return out


# ----------------------------------------------------------------------------- helpers
def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The last match: a log holding several starts describes the last one."""
    matches = list(pattern.finditer(text))
    return matches[-1] if matches else None


def _bool(text: str) -> bool | None:
    t = text.strip().strip("'\"").lower()
    return True if t == "true" else False if t == "false" else None


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
        m = _last(_V[name], text)
        if m:
            v = _num(m[1])
            f._set(name, v if name == "kv_cache_gib" else int(v), source)
    m = _last(_V["usage"], text)
    if m:
        for value, what in _USAGE_PART.findall(m[1]):
            name = _USAGE_NAMES.get(what.lower().removesuffix(" memory"))
            if name:
                f._set(name, float(value), source)
    if f.weights_gib is None and (m := _last(_V["weights_loaded"], text)):
        f._set("weights_gib", float(m[1]), source)
    if m := _last(_V["free"], text):
        f._set("free_at_start_gib", float(m[1]), source)
        f._set("gpu_total_gib", float(m[2]), source)
    for name in ("attention_backend", "moe_backend", "version", "load_format", "kv_cache_dtype"):
        m = _V[name].search(text)
        if m:
            f._set(name, next(g for g in m.groups() if g is not None), source)
    if m := _V["prefix_caching"].search(text):
        f._set("prefix_caching", _bool(m[1]), source)
    if m := _V["max_model_len"].search(text):
        f._set("max_model_len", int(next(g for g in m.groups() if g)), source)
    if m := _V["mem_fraction"].search(text):
        f._set("mem_fraction", float(next(g for g in m.groups() if g)), source)
    if m := _last(_V["block_size"], text):
        f._set("block_size", int(next(g for g in m.groups() if g)), source)
    if m := _last(_V["max_concurrency"], text):
        f._set("max_concurrency", float(m[1]), source)
    # the launch's --max-num-seqs, which vLLM runs with; its default is not logged (None)
    if m := _last(_V["max_num_seqs"], text):
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
        if m := _last(_S[name], text):
            f._set(name, float(m[1]), source)
    if m := _last(_S["kv"], text):
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
    if m := _last(_S["summary"], text):
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
        f._set("prefix_caching", not _bool(m[1]), source)
    if m := _last(_S["mamba"], text):
        f._set("state_slots", int(m[1]), source)
        # conv_state and ssm_state (and, with speculative decoding, the intermediate caches)
        sizes = re.findall(r"\b\w+ size: ([\d.]+) ?GB", m[2])
        if sizes:
            f._set("state_pool_gib", round(sum(map(float, sizes)), 4), source)
    reduced = _last(_S["reduced"], text)
    if m := _last(_S["requested"], text):       # None: not given (the engine's default)
        f._set("max_running_requested", None if m[1] == "None" else int(m[1]), source)
    elif reduced:
        f._set("max_running_requested", int(reduced[1]), source)
    if m := _last(_S["max_running"], text):
        f._set("max_running", int(m[1]), source)
    elif reduced:
        f._set("max_running", int(reduced[2]), source)
    f.jit.extend(jit_events(text))
    return f


def parse_log(engine: str, text: str, source: str = "log") -> EngineFacts:
    if engine not in LOG_PARSERS:
        raise ValueError(f"unknown engine {engine!r}")
    return LOG_PARSERS[engine](text, source)


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


# What each engine's start-up log and settings endpoint say, by engine name (an engine added to
# model/engines gets its parsers here: its log lines are this job's knowledge, not the model's)
LOG_PARSERS = {"vllm": parse_vllm_log, "sglang": parse_sglang_log}
SERVER_INFO_PARSERS = {"sglang": parse_sglang_server_info}
# Engines that run with the running-request limit they were launched with (SGLang may lower
# it to what its KV and state pools hold, and says so)
RUNS_AS_LAUNCHED = {"vllm"}


# ----------------------------------------------------------------------------- /metrics
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
    hybrid model's state slots (free + evictable + in use)."""
    f = EngineFacts()
    slots: dict[str, float] = {}
    for name, labels, value in metric_samples(text):
        if name == "vllm:cache_config_info":
            def num(key: str, labels: dict[str, str] = labels) -> int | None:
                v = labels.get(key, "")
                return int(v) if v.isdigit() and int(v) > 0 else None
            blocks, size = num("num_gpu_blocks"), num("block_size")
            f._set("block_size", size, source)
            f._set("num_gpu_blocks", blocks, source)
            tokens = num("kv_cache_size_tokens") or (blocks * size if blocks and size else None)
            f._set("kv_capacity_tokens", tokens, source)
            f._set("prefix_caching", _bool(labels.get("enable_prefix_caching", "")), source)
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


# ----------------------------------------------------------------------------- JIT
_JIT = re.compile(r"(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\d\d-\d\d \d\d:\d\d:\d\d)"
                  r".*?JIT compilation during inference: (?P<kernel>[\w.\-]+?)\.?(?:\s|$)")


def jit_events(text: str) -> list[JitEvent]:
    return [JitEvent(m["kernel"], m["ts"], m[0][:300]) for m in _JIT.finditer(text)]


def log_time(text: str, near: dt.datetime) -> dt.datetime | None:
    """A log timestamp (``YYYY-MM-DD HH:MM:SS`` or ``MM-DD HH:MM:SS``) in ``near``'s time
    zone; without a year, the one closest to ``near``."""
    tz = near.tzinfo
    try:
        if len(text) == 19:
            return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=tz)
        best = None
        for year in (near.year - 1, near.year, near.year + 1):
            try:
                t = dt.datetime.strptime(f"{year}-{text}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=tz)
            except ValueError:          # 02-29 in a year without it
                continue
            if best is None or abs(t - near) < abs(best - near):
                best = t
        return best
    except ValueError:
        return None


class LogTail:
    """Reads what a growing log gained since the last ``read`` (a torn last line waits)."""

    def __init__(self, path: str | Path, offset: int = 0):
        self.path = Path(path)
        self.offset = offset

    def read(self) -> str:
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return ""
        cut = data.rfind(b"\n") + 1
        self.offset += cut
        return data[:cut].decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------- combined
class FactsError(CalibrationError, ValueError):
    """Engine facts that contradict a flag; the message names the flag and both values."""


def _flag_value(command: list[str], flag: str) -> str | None:
    """The last value of ``flag`` (``--flag V`` or ``--flag=V``; ``_`` for ``-`` too)."""
    value = None
    for i, part in enumerate(command):
        name, eq, rest = part.partition("=")
        if not name.startswith("--") or name.replace("_", "-") != flag:
            continue
        if eq:
            value = rest
        elif i + 1 < len(command):
            value = command[i + 1]
    return value


def command_facts(engine: str, command: list[str]) -> EngineFacts:
    """What a launched engine's argv sets: ``--load-format`` and the running-request limit
    (the engine's ``max_running_flag``: vLLM ``--max-num-seqs``, SGLang
    ``--max-running-requests``), which vLLM runs with as given."""
    f = EngineFacts()
    f._set("load_format", _flag_value(command, "--load-format"), "command")
    flag = engines.REGISTRY[engine].max_running_flag if engine in engines.REGISTRY else None
    value = _flag_value(command, flag) if flag else None
    if value is not None and value.isdigit() and int(value) > 0:
        f._set("max_running_requested", int(value), "command")
        if engine in RUNS_AS_LAUNCHED:
            f._set("max_running", int(value), "command")
    return f


def gather(engine: str, *, metrics: str | None = None, server_info: Any = None,
           log: str | None = None, command: list[str] | None = None) -> EngineFacts:
    """Every source at hand, the live ones first (``/metrics``, server info) and the start-up
    log after them; ``command``: a launched engine's argv (``command_facts``)."""
    facts = EngineFacts()
    if metrics:
        facts = facts.merged(parse_metrics(metrics))
    if server_info is not None and engine in SERVER_INFO_PARSERS:
        facts = facts.merged(SERVER_INFO_PARSERS[engine](server_info))
    if command:
        facts = facts.merged(command_facts(engine, command))
    if log:
        facts = facts.merged(parse_log(engine, log))
    return facts


def weights_of(facts: EngineFacts, load_format: str | None) -> str:
    """A row's ``weights``: ``--load-format`` when given (an engine that says otherwise is an
    error), else what the engine states, else ``real``."""
    stated = facts.dummy_weights
    if load_format is not None:
        if load_format not in ("dummy", "real"):
            raise FactsError(f"--load-format: expected dummy or real, got {load_format!r}")
        if stated is not None and stated != (load_format == "dummy"):
            raise FactsError(f"--load-format {load_format} contradicts the engine, which "
                             f"reports load_format {facts.load_format!r} (from "
                             f"{facts.sources.get('load_format', '?')})")
        return load_format
    return "dummy" if stated else "real"
