"""The simulator's SGLang: scheduler log lines, flat non-stream errors, its native API and
server-info routes, batch (de)tokenize, ``sglang:`` metrics."""

from __future__ import annotations

from model.engines import sglang
from sim.engines.base import SimEngine
from sim.metrics import gauge, histogram


class Sglang(SimEngine):
    engine = sglang.ENGINE
    version = "0.5.3+sim"
    flat_errors = True
    prefixed_ids = False
    checks_model_name = False     # SGLang serves its one model whatever the name
    batch_tokenize = True
    detokenize_key = "text"
    routes = (("/health_generate", "health_generate", "GET"),
              ("/get_model_info", "model_info", "GET"),
              ("/get_server_info", "server_info", "GET"),
              ("/server_info", "server_info", "GET"),
              ("/v1/tokenize", "tokenize", "POST"),
              ("/v1/detokenize", "detokenize", "POST"))
    native_api = True

    def log_line(self, now, level, where, message):
        return f"[{now:%Y-%m-%d %H:%M:%S} TP0] {message}"

    def startup(self, log, cfg, capacity, kv_gib):
        log(f"server_args=ServerArgs(model_path='{cfg.model_name}', tp_size={cfg.num_gpus}, "
            f"dcp_size={cfg.dcp_size}, mem_fraction_static={cfg.mem_fraction}, "
            f"max_running_requests={cfg.max_running}, random_seed={cfg.seed})")
        log(f"KV Cache is allocated. #tokens: {capacity}, KV size: {kv_gib:.2f} GB")

    def too_long(self, log, cfg, capacity, kv_gib):
        log(f"context_len={cfg.max_model_len} exceeds max_total_num_tokens={capacity}; "
            f"clamping context_len to {capacity}")
        return capacity

    def limits(self, log, cfg, capacity, max_model_len):
        free = cfg.gpu_spec.memory_bytes * (1 - cfg.mem_fraction) / 1024**3
        log(f"max_total_num_tokens={capacity}, chunked_prefill_size=8192, max_prefill_tokens=16384,"
            f" max_running_requests={cfg.max_running}, context_len={max_model_len}, "
            f"available_gpu_mem={free:.2f} GB")

    def ready(self, log, cfg):
        log("The server is fired up and ready to roll!")

    def metric_lines(self, out, core, labels, info, now):
        m = self.engine.metrics
        s = core.stats
        gauge(out, m.running, labels, core.num_running, "The number of running requests.")
        gauge(out, m.waiting, labels, core.num_waiting,
              "The number of requests in the waiting queue.")
        gauge(out, "sglang:num_used_tokens", labels, core.kv_used_tokens(),
              "The number of used tokens.")
        gauge(out, m.kv_usage, labels, core.kv_usage(), "The token usage.")
        gauge(out, "sglang:gen_throughput", labels, s.gen_throughput(now),
              "The generation throughput (token/s).")
        hit = s.cached_prompt_tokens / s.prompt_tokens if s.prompt_tokens else 0.0
        gauge(out, "sglang:cache_hit_rate", labels, float(hit), "The prefix cache hit rate.")
        gauge(out, m.prompt_tokens, labels, s.prompt_tokens,
              "Number of prefill tokens processed.", "counter")
        gauge(out, m.generation_tokens, labels, s.generation_tokens,
              "Number of generation tokens processed.", "counter")
        gauge(out, "sglang:num_requests_total", labels, sum(s.finished.values()),
              "Number of requests processed.", "counter")
        histogram(out, m.ttft, labels, s.ttft, "Histogram of time to first token in seconds.")
        histogram(out, "sglang:time_per_output_token_seconds", labels, s.tpot,
                  "Histogram of time per output token in seconds.")
        histogram(out, m.inter_token, labels, s.itl,
                  "Histogram of inter-token latency in seconds.")
        histogram(out, m.e2e, labels, s.e2e,
                  "Histogram of End-to-end request latency in seconds")


ENGINE = Sglang()
