"""The simulator's SGLang: scheduler log lines, flat non-stream errors, its native API and
server-info routes, batch (de)tokenize, ``sglang:`` metrics.

A hybrid model's start-up lines are SGLang 0.5.16's for its two pools
(``engine_advisor.model.engines.sglang``): "Mamba Cache is allocated" (the state slots and the
tensors' sizes, one padding slot included), "KV Cache is allocated" (the KV pool's tokens and its K
and V tensors, one padding row included), the warning when the state slots cut a requested
running-request limit, and the scheduler's summary with the running-request limit it starts with.
A model with sliding-window layers beside full-attention ones logs its SWA pool instead ("Use
sliding window memory pool": the full pool's tokens and the SWA pool's)."""

from __future__ import annotations

from engine_advisor.model.engines import sglang
from engine_advisor.model.physics.memory import hybrid_shape
from engine_advisor.sim.engines.base import GIB, SimEngine, hybrid, kv_gib, longest
from engine_advisor.sim.metrics import gauge, histogram

CONV_BYTES = 2      # SGLang's convolution-window dtype: bfloat16 (SGLANG_MAMBA_CONV_DTYPE)


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

    def startup(self, log, cfg, pool):
        ratio = cfg.mamba_full_memory_ratio or sglang.STATE_RATIO
        log(f"server_args=ServerArgs(model_path='{cfg.model_name}', tp_size={cfg.num_gpus}, "
            f"dcp_size={cfg.dcp_size}, mem_fraction_static={cfg.mem_fraction}, "
            f"max_running_requests={cfg.max_running}, "
            f"disable_radix_cache={cfg.disable_prefix_caching}, random_seed={cfg.seed}, "
            f"max_mamba_cache_size={cfg.max_mamba_cache_size}, "
            f"mamba_full_memory_ratio={ratio})")
        if not hybrid(pool):
            log(f"KV Cache is allocated. #tokens: {pool.capacity_tokens}, "
                f"KV size: {kv_gib(cfg, pool):.2f} GB")
            return
        if pool.layout.windows:
            log(f"Use sliding window memory pool. full_layer_tokens={pool.capacity_tokens}, "
                f"swa_layer_tokens={int(pool.capacity_tokens * sglang.SWA_RATIO)}")
            log(f"KV Cache is allocated. #tokens: {pool.capacity_tokens}, "
                f"KV size: {kv_gib(cfg, pool):.2f} GB")
            return
        if cfg.max_running and pool.max_running < cfg.max_running:
            log(f"max_running_requests was reduced from the requested {cfg.max_running} to "
                f"{pool.max_running} (per dp worker) due to the available KV cache capacity.",
                level="WARNING")
        conv, ssm = self.state_split(cfg, pool)
        rows = pool.state_slots + 1         # the pools allocate one padding slot
        log(f"Mamba Cache is allocated. max_mamba_cache_size: {pool.state_slots}, "
            f"conv_state size: {rows * conv / GIB:.2f}GB, "
            f"ssm_state size: {rows * ssm / GIB:.2f}GB ")
        # the KV pool: tokens per rank (DCP stripes the logical tokens over dcp ranks) plus
        # one padding row, at the KV bytes of a token of every full-attention layer
        kv = (pool.capacity_tokens / cfg.dcp_size + 1) * cfg.kv_bytes_per_gpu_token / GIB
        sizes = (f"KV size: {kv:.2f} GB" if cfg.shape().attention == "mla"
                 else f"K size: {kv / 2:.2f} GB, V size: {kv / 2:.2f} GB")
        log(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: {pool.capacity_tokens}, "
            f"{sizes}")

    @staticmethod
    def state_split(cfg, pool) -> tuple[float, float]:
        """One request's state bytes per GPU, (convolution window, recurrent state): the
        convolution's elements of every linear-attention layer (``HybridShape.conv_elems``) at
        bfloat16, the rest of the layout's state bytes the recurrent (SSM) state, at the dtype
        the layout chose for it (float32 unless the config says otherwise)."""
        gpu = cfg.gpu_spec
        h = hybrid_shape(cfg.shape(), cfg.num_gpus, gpu.name, gpu.memory_bytes)
        state = pool.layout.state_bytes
        conv = min(h.n_linear * h.conv_elems * CONV_BYTES, state) if h is not None else 0.0
        return conv, state - conv

    def slots_per_request(self, cfg, pool):
        """Five with the radix cache (three for it, two ping-pong slots of the overlap
        scheduler), one without; none without a state pool."""
        if not pool.state_slots:
            return 0
        return 1 if cfg.disable_prefix_caching else int(pool.layout.state_units)

    def too_long(self, log, cfg, pool):
        cap = pool.capacity_tokens
        fit = min(cap, longest(pool))
        if fit < 1:
            log("Not enough memory. Please try to increase --mem-fraction-static.",
                level="ERROR")
            return None
        log(f"context_len={cfg.max_model_len} exceeds max_total_num_tokens={cap}; "
            f"clamping context_len to {fit}")
        return fit

    def limits(self, log, cfg, pool, max_model_len):
        free = cfg.gpu_spec.memory_bytes * (1 - cfg.mem_fraction) / GIB
        log(f"max_total_num_tokens={pool.capacity_tokens}, chunked_prefill_size=8192, "
            f"max_prefill_tokens=16384, max_running_requests={pool.max_running}, "
            f"context_len={max_model_len}, available_gpu_mem={free:.2f} GB")

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
        gauge(out, "sglang:max_total_num_tokens", labels, core.pool.capacity_tokens,
              "Maximum total number of tokens in the KV cache pool.")
        slots = core.pool.state_slots
        if slots and not core.pool.layout.windows:
            # the state pool, in slots: free, cached (never, here), in use
            used = min(core.num_running * core.slots_per_request, slots)
            gauge(out, "sglang:mamba_usage", labels, used / slots,
                  "The token usage for Mamba layers.")
            gauge(out, "sglang:mamba_available_tokens", labels, slots - used,
                  "Number of free state slots in the mamba SSM pool (hybrid-SSM only).")
            gauge(out, "sglang:mamba_evictable_tokens", labels, 0,
                  "Number of evictable (radix-cached) state slots in the mamba SSM pool.")
            gauge(out, "sglang:mamba_used_tokens", labels, used,
                  "Number of actively used state slots in the mamba SSM pool.")
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
