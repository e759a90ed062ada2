"""The simulator's TensorRT-LLM (``trtllm-serve``, PyTorch backend), from its source
(NVIDIA/TensorRT-LLM; it cannot be installed here, so no real log was seen):

- routes (``tensorrt_llm/serve/openai_server.py``): the OpenAI ones, ``GET /health``,
  ``/health_generate`` ("Generation health check OK"), ``/version``, ``GET /metrics`` answering
  JSON iteration stats (``engine_advisor.sim.engines.trtllm_stats``) and, with
  ``return_perf_metrics: true`` in the ``--config`` file, Prometheus text at
  ``/prometheus/metrics``; no ``/tokenize`` (404). The simulator answers as a server launched with
  the ``--config`` file ``engine_advisor.model.engines.trtllm.config_file`` writes (iteration
  stats and Prometheus metrics on).
- errors (``OpenAIServer.create_error_response``): the flat ``{"object": "error", "message",
  "type", "param", "code"}``; the model name of a request is not checked.
- metric names (``tensorrt_llm/metrics/collector.py``): ``trtllm_`` prefix, labels
  ``model_name`` and ``engine_type``, which ``trtllm-serve`` sets to ``"undefined"``; the KV
  gauges count blocks of 32 tokens holding the running requests' tokens, and
  ``trtllm_kv_cache_utilization`` is used / max blocks, as the collector computes it. The real
  server updates these gauges from the iteration stats it drains; the simulator reads them live.
- start-up lines: the PyTorch backend's KV estimate (``tensorrt_llm/_torch/pyexecutor/_util.py``:
  "Peak memory during memory usage profiling ...", "Estimated max memory in KV cache : X GiB"),
  the C++ KV cache manager's "Max KV cache blocks per sequence ...", "Number of tokens per
  block: 32." and "[MemUsageChange] Allocated X GiB for max tokens in paged KV cache (N).",
  and "max_seq_len=..., max_num_requests=..., max_num_tokens=..., max_batch_size=..."; a
  ``max_seq_len`` longer than the cache holds is cut to it with warnings.

The numbers are the cost model's (``SimConfig.pool``): the KV bytes per GPU of the pool, N its
tokens in whole blocks of 32. ``--mem-fraction`` is the recommender's whole-GPU fraction ``f``;
the log states TensorRT-LLM's own ``--kv_cache_free_gpu_memory_fraction`` for it
(``engine_advisor.model.engines.trtllm.free_fraction``): what was in use before the KV cache
(``f x memory - KV``) is the profiled peak, and the KV is that share of the rest.
"""

from __future__ import annotations

import math
import time
from weakref import WeakKeyDictionary

from engine_advisor.model.engines import trtllm
from engine_advisor.sim.engines.base import GIB, SimEngine, kv_gib, longest
from engine_advisor.sim.engines.trtllm_stats import IterationLog
from engine_advisor.sim.metrics import gauge, histogram

BLOCK = trtllm.TOKENS_PER_BLOCK
MAX_NUM_TOKENS = 8192           # --max_num_tokens' default (tokens per iteration)
LEVELS = {"INFO": ("I", "INFO"), "WARNING": ("W", "WARNING"), "ERROR": ("E", "ERROR")}


def blocks(tokens: int) -> int:
    return max(tokens, 0) // BLOCK


class Trtllm(SimEngine):
    engine = trtllm.ENGINE
    version = "1.2.0+sim"
    flat_errors = True
    prefixed_ids = True
    checks_model_name = False
    batch_tokenize = False
    detokenize_key = "prompt"
    routes = (("/version", "version", "GET"),
              ("/health_generate", "health_generate", "GET"),
              ("/prometheus/metrics", "prometheus_metrics", "GET"))
    native_api = False
    tokenize = False
    json_metrics = True
    health_generate_text = "Generation health check OK"

    def __init__(self) -> None:
        self._logs: WeakKeyDictionary = WeakKeyDictionary()     # engine core -> its stats

    # ---------------------------------------------------------------- logs
    def log_line(self, now, level, where, message):
        """``where="cpp"``: the C++ runtime's ``[TensorRT-LLM][INFO]`` lines; ``"version"``:
        the package's import banner; else the Python logger's ``[MM/DD/YYYY-HH:MM:SS] [TRT-LLM]
        [I]``."""
        short, long = LEVELS.get(level, ("I", level))
        if where == "version":
            return f"[TensorRT-LLM] {message}"
        if where == "cpp":
            return f"[TensorRT-LLM][{long}] {message}"
        return f"[{now:%m/%d/%Y-%H:%M:%S}] [TRT-LLM] [{short}] {message}"

    @staticmethod
    def memory(cfg, pool) -> tuple[float, float, float, float]:
        """(device bytes, bytes in use before the KV cache, KV bytes, TensorRT-LLM's free-memory
        fraction) per GPU."""
        total = cfg.gpu_spec.memory_bytes
        kv = kv_gib(cfg, pool) * GIB
        used = max(cfg.mem_fraction * total - kv, 0.0)
        return total, used, kv, trtllm.free_fraction(cfg.mem_fraction, total, used)

    def startup(self, log, cfg, pool):
        log(f"TensorRT-LLM version: {self.version}", where="version")
        total, used, kv, free = self.memory(cfg, pool)
        per_token = cfg.kv_bytes_per_gpu_token / cfg.dcp_size
        log(f"Peak memory during memory usage profiling (torch + non-torch): {used / GIB:.2f} "
            f"GiB, available KV cache memory when calculating max tokens: {kv / GIB:.2f} GiB, "
            f"fraction is set {round(free, 4)}, kv size is {round(per_token)}. device total "
            f"memory {total / GIB:.2f} GiB, , tmp kv_mem 0.00 GiB")
        log(f"Estimated max memory in KV cache : {kv / GIB:.2f} GiB")
        n = blocks(pool.capacity_tokens)
        window = min(cfg.max_model_len, n * BLOCK)
        log(f"Max KV cache blocks per sequence: {math.ceil(window / BLOCK)} [window size="
            f"{window}], tokens per block={BLOCK}, primary blocks={n}, secondary blocks=0, "
            f"max sequence length={window}", where="cpp")
        log(f"Number of tokens per block: {BLOCK}.", where="cpp")
        log(f"[MemUsageChange] Allocated {kv / GIB:.2f} GiB for max tokens in paged KV cache "
            f"({n * BLOCK}).", where="cpp")

    def too_long(self, log, cfg, pool):
        fit = min(blocks(pool.capacity_tokens) * BLOCK, longest(pool))
        if fit < 1:
            log("Not enough GPU memory for the KV cache: increase "
                "--kv_cache_free_gpu_memory_fraction or use more GPUs.", level="ERROR")
            return None
        log(f"Attention window size {cfg.max_model_len} exceeds upper bound {fit} for available "
            f"blocks. Reducing to {fit}.", level="WARNING")
        log(f"Adjusted max_seq_len to {fit}", level="WARNING")
        return fit

    def limits(self, log, cfg, pool, max_model_len):
        b = pool.max_running
        log(f"max_seq_len={max_model_len}, max_num_requests={b}, "
            f"max_num_tokens={MAX_NUM_TOKENS}, max_batch_size={b}")

    def ready(self, log, cfg):
        """Nothing of its own: uvicorn's "Application startup complete." says it."""

    # ---------------------------------------------------------------- JSON /metrics
    def attach(self, core, cfg):
        log = IterationLog(core.pool.max_running, MAX_NUM_TOKENS, BLOCK,
                           core.pool.capacity_tokens,
                           int(cfg.mem_fraction * cfg.gpu_spec.memory_bytes))
        self._logs[core] = log
        core.on_step = lambda *a: log.record(core, *a)

    def iteration_stats(self, core):
        log = self._logs.get(core)
        return log.drain() if log is not None else []

    # ---------------------------------------------------------------- /prometheus/metrics
    def render_metrics(self, core, model_name, info):
        out: list[str] = []
        self.metric_lines(out, core, 'model_name="undefined",engine_type="undefined"', info,
                          time.monotonic())
        return "\n".join(out) + "\n"

    def metric_lines(self, out, core, labels, info, now):
        m = self.engine.metrics
        s = core.stats
        max_blocks = blocks(core.pool.capacity_tokens)
        used = min(math.ceil(core.kv_used_tokens() / BLOCK), max_blocks)
        gauge(out, m.running, labels, core.num_running, "Number of active requests")
        gauge(out, m.waiting, labels, core.num_waiting, "Number of queued requests")
        gauge(out, m.kv_usage, labels, used / max_blocks if max_blocks else 0.0,
              "KV cache utilization")
        gauge(out, "trtllm_kv_cache_max_blocks", labels, max_blocks,
              "Maximum number of KV cache blocks")
        gauge(out, "trtllm_kv_cache_free_blocks", labels, max_blocks - used,
              "Number of free KV cache blocks")
        gauge(out, "trtllm_kv_cache_used_blocks", labels, used, "Number of used KV cache blocks")
        gauge(out, "trtllm_kv_cache_tokens_per_block", labels, BLOCK,
              "Number of tokens per KV cache block")
        gauge(out, "trtllm_max_num_active_requests", labels, core.pool.max_running,
              "Maximum number of active requests")
        gauge(out, "trtllm_max_batch_size_static", labels, core.pool.max_running,
              "Static maximum batch size")
        hit = s.cached_prompt_tokens / s.prompt_tokens if s.prompt_tokens else 0.0
        gauge(out, "trtllm_kv_cache_hit_rate", labels, float(hit), "KV cache hit rate")
        gauge(out, m.prompt_tokens, labels, s.prompt_tokens,
              "Cumulative number of prompt (input) tokens processed.", "counter")
        gauge(out, m.generation_tokens, labels, s.generation_tokens,
              "Cumulative number of generation (output) tokens produced.", "counter")
        out.append("# HELP trtllm_request_success_total Count of successfully processed "
                   "requests.")
        out.append("# TYPE trtllm_request_success_total counter")
        for reason, n in s.finished.items():
            if reason != "abort":
                out.append(f'trtllm_request_success_total{{{labels},finished_reason="{reason}"}}'
                           f" {n}")
        histogram(out, m.ttft, labels, s.ttft, "Histogram of time to first token in seconds.")
        histogram(out, m.inter_token, labels, s.tpot,
                  "Histogram of time per output token in seconds.")
        histogram(out, m.e2e, labels, s.e2e,
                  "Histogram of end to end request latency in seconds.")
        histogram(out, "trtllm_request_queue_time_seconds", labels, s.queue,
                  "Histogram of time spent in WAITING phase for request.")


ENGINE = Trtllm()
