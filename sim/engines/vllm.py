"""The simulator's vLLM: OpenAI server log lines, nested errors, ``/version`` and ``/load``,
``vllm:`` metrics."""

from __future__ import annotations

from model.engines import vllm
from sim.engines.base import SimEngine
from sim.metrics import gauge, histogram


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

    def startup(self, log, cfg, capacity, kv_gib):
        log(f"vLLM API server version {cfg.version}", where="api_server.py")
        log(f"non-default args: {{'model': '{cfg.model_name}', 'tensor_parallel_size': "
            f"{cfg.num_gpus}, 'decode_context_parallel_size': {cfg.dcp_size}, "
            f"'gpu_memory_utilization': {cfg.mem_fraction}, 'max_num_seqs': {cfg.max_running}}}",
            where="utils.py")
        log(f"Available KV cache memory: {kv_gib:.2f} GiB", where="gpu_worker.py")
        log(f"GPU KV cache size: {capacity:,} tokens", where="kv_cache_utils.py")

    def too_long(self, log, cfg, capacity, kv_gib):
        need = cfg.max_model_len * cfg.kv_bytes_per_gpu_token / cfg.dcp_size / 1024**3
        log(f"ValueError: To serve at least one request with the models's max seq len "
            f"({cfg.max_model_len}), {need:.2f}"
            f" GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({kv_gib:.2f} GiB). Try increasing `gpu_memory_utilization` or decreasing "
            f"`max_model_len` when initializing the engine.", level="ERROR")
        return None

    def limits(self, log, cfg, capacity, max_model_len):
        log(f"Maximum concurrency for {max_model_len:,} tokens per request: "
            f"{capacity / max_model_len:.2f}x", where="kv_cache_utils.py")

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
