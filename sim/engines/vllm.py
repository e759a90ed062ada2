"""The simulator's vLLM: OpenAI server log lines, nested errors, ``/version`` and ``/load``,
``vllm:`` metrics.

A hybrid model's start-up lines are vLLM 0.26.0's for its one pool of pages
(``engine_advisor.model.engines.vllm``): the layout's notes (the attention block raised to the
state's page, the state page padded, padding layers), "Available KV cache memory" (the pool's pages:
blocks x page x layers per group), "GPU KV cache size" (the pool over one request of the model's
maximum length, times that length) and "Maximum concurrency" (blocks / blocks of one request of the
served length)."""

from __future__ import annotations

from engine_advisor.model.engines import vllm
from engine_advisor.sim.engines.base import GIB, SimEngine, hybrid, kv_gib
from engine_advisor.sim.metrics import gauge, histogram
from engine_advisor.sim.prefix import BLOCK


class Vllm(SimEngine):
    engine = vllm.ENGINE
    version = "0.11.0+sim"
    flat_errors = False
    prefixed_ids = True
    checks_model_name = True
    batch_tokenize = False
    detokenize_key = "prompt"
    routes = (("/version", "version", "GET"), ("/load", "load", "GET"))
    native_api = False

    def log_line(self, now, level, where, message):
        return f"{level} {now:%m-%d %H:%M:%S} [{where}] {message}"

    @staticmethod
    def blocks(pool) -> float:
        """A hybrid's pool blocks, the null block included (``Pool.units`` leaves it out)."""
        return pool.units + 1 if pool.units > 0 else 0.0

    def memory_gib(self, cfg, pool) -> float:
        """What "Available KV cache memory" states: for a hybrid the pool's blocks x page x
        layers per group (the budget rounded down to whole blocks), else the KV tokens'."""
        if hybrid(pool):
            return self.blocks(pool) * pool.layout.unit_bytes / GIB
        return kv_gib(cfg, pool)

    def concurrency(self, pool, max_model_len: int) -> float:
        """Requests of ``max_model_len`` tokens the pool holds at once (vLLM's "Maximum
        concurrency": blocks / blocks of one such request, for a hybrid)."""
        if hybrid(pool):
            return self.blocks(pool) / pool.units_for(max_model_len)
        return pool.capacity_tokens / max_model_len

    def startup(self, log, cfg, pool):
        log(f"vLLM API server version {self.version}", where="api_server.py")
        args = {"model": cfg.model_name, "tensor_parallel_size": cfg.num_gpus,
                "decode_context_parallel_size": cfg.dcp_size,
                "gpu_memory_utilization": cfg.mem_fraction}
        if cfg.max_running:
            args["max_num_seqs"] = cfg.max_running
        log(f"non-default args: {args!r}", where="utils.py")
        padding = [n for n in pool.layout.notes if n.startswith("Add ")]
        for note in pool.layout.notes:
            if note not in padding:
                log(note, where="interface.py")
        for note in padding:         # once while profiling, once when allocating (as 0.26.0)
            log(note, level="WARNING", where="kv_cache_utils.py")
        log(f"Available KV cache memory: {round(self.memory_gib(cfg, pool), 2)} GiB",
            where="gpu_worker.py")
        for note in padding:
            log(note, level="WARNING", where="kv_cache_utils.py")
        log(f"GPU KV cache size: {pool.capacity_tokens:,} tokens", where="kv_cache_utils.py")

    def too_long(self, log, cfg, pool):
        if hybrid(pool):
            need = pool.units_for(cfg.max_model_len) * pool.layout.unit_bytes / GIB
        else:
            need = cfg.max_model_len * cfg.kv_bytes_per_gpu_token / cfg.dcp_size / GIB
        log(f"ValueError: To serve at least one request with the models's max seq len "
            f"({cfg.max_model_len}), {need:.2f}"
            f" GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({self.memory_gib(cfg, pool):.2f} GiB). Try increasing `gpu_memory_utilization` "
            f"or decreasing `max_model_len` when initializing the engine.", level="ERROR")
        return None

    def limits(self, log, cfg, pool, max_model_len):
        log(f"Maximum concurrency for {max_model_len:,} tokens per request: "
            f"{self.concurrency(pool, max_model_len):.2f}x", where="kv_cache_utils.py")

    def prefix_caching(self, cfg, pool):
        """Off for hybrid models: vLLM 0.26.0 enables it by default only for models without
        linear-attention layers (its pool then holds one state block per request)."""
        return not cfg.disable_prefix_caching and not hybrid(pool)

    def cache_info(self, pool, max_model_len):
        if not hybrid(pool):
            return {"block_size": str(BLOCK), "num_gpu_blocks": str(pool.capacity_tokens // BLOCK)}
        # a hybrid's blocks hold state too: the tokens and concurrency as its log states them
        return {"block_size": str(int(pool.layout.block_tokens)),
                "num_gpu_blocks": str(int(self.blocks(pool))),
                "kv_cache_size_tokens": str(pool.capacity_tokens),
                "kv_cache_max_concurrency": repr(self.concurrency(pool, max_model_len))}

    def ready(self, log, cfg):
        log(f"Starting vLLM API server on http://{cfg.host}:{cfg.port}", where="launcher.py")

    def metric_lines(self, out, core, labels, info, now):
        m = self.engine.metrics
        s = core.stats
        labels += ',engine="0"'
        gauge(out, m.running, labels, core.num_running,
              "Number of requests in model execution batches.")
        gauge(out, m.waiting, labels, core.num_waiting,
              "Number of requests waiting to be processed.")
        gauge(out, m.kv_usage, labels, core.kv_usage(),
              "KV-cache usage. 1 means 100 percent usage.")
        gauge(out, "vllm:gpu_cache_usage_perc", labels, core.kv_usage(),
              "GPU KV-cache usage (older name). 1 means 100 percent usage.")
        gauge(out, m.prompt_tokens, labels, s.prompt_tokens,
              "Number of prefill tokens processed.", "counter")
        gauge(out, m.generation_tokens, labels, s.generation_tokens,
              "Number of generation tokens processed.", "counter")
        gauge(out, "vllm:prefix_cache_queries_total", labels, s.prompt_tokens,
              "Prefix cache queries, in terms of number of queried tokens.", "counter")
        gauge(out, "vllm:prefix_cache_hits_total", labels, s.cached_prompt_tokens,
              "Prefix cache hits, in terms of number of cached tokens.", "counter")
        out.append("# HELP vllm:request_success_total Count of successfully processed requests.")
        out.append("# TYPE vllm:request_success_total counter")
        for reason, n in s.finished.items():
            out.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {n}')
        histogram(out, m.ttft, labels, s.ttft, "Histogram of time to first token in seconds.")
        histogram(out, m.inter_token, labels, s.itl,
                  "Histogram of inter-token latency in seconds.")
        histogram(out, m.e2e, labels, s.e2e,
                  "Histogram of end to end request latency in seconds.")
        histogram(out, "vllm:request_queue_time_seconds", labels, s.queue,
                  "Histogram of time spent in WAITING phase for request.")
        info_labels = ",".join(f'{k}="{v}"' for k, v in sorted(info.items()))
        out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
        out.append("# TYPE vllm:cache_config_info gauge")
        out.append(f"vllm:cache_config_info{{{labels},{info_labels}}} 1.0")


ENGINE = Vllm()
