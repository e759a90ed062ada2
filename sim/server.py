"""Start the simulator: engine-like startup log lines, memory checks, then uvicorn."""

from __future__ import annotations

import datetime as dt
import sys
import time

from model.costmodel import CostModel
from sim.app import SimState, create_app
from sim.config import SimConfig
from sim.faults import oom_message
from sim.timing import StepTimer
from sim.tokenizer import BUILTIN, Tokenizer


def _logger(engine: str):
    def log(message: str, level: str = "INFO", where: str = "simulator") -> None:
        now = dt.datetime.now()
        if engine == "vllm":
            line = f"{level} {now:%m-%d %H:%M:%S} [{where}] {message}"
        else:
            line = f"[{now:%Y-%m-%d %H:%M:%S} TP0] {message}"
        print(line, flush=True)
    return log


def serve(cfg: SimConfig, model: CostModel, tok: Tokenizer = BUILTIN) -> int:
    """Run until interrupted; the exit status is non-zero when startup fails like an engine."""
    log = _logger(cfg.engine)
    gib = 1024**3
    gpu = cfg.gpu_spec
    capacity = cfg.kv_capacity()
    kv_gib = capacity * cfg.kv_bytes_per_gpu_token / cfg.dcp_size / gib
    if cfg.engine == "vllm":
        log(f"vLLM API server version {cfg.version}", where="api_server.py")
        log(f"non-default args: {{'model': '{cfg.model_name}', 'tensor_parallel_size': "
            f"{cfg.num_gpus}, 'decode_context_parallel_size': {cfg.dcp_size}, "
            f"'gpu_memory_utilization': {cfg.mem_fraction}, 'max_num_seqs': {cfg.max_running}}}",
            where="utils.py")
        log(f"Available KV cache memory: {kv_gib:.2f} GiB", where="gpu_worker.py")
        log(f"GPU KV cache size: {capacity:,} tokens", where="kv_cache_utils.py")
    else:
        log(f"server_args=ServerArgs(model_path='{cfg.model_name}', tp_size={cfg.num_gpus}, "
            f"dcp_size={cfg.dcp_size}, mem_fraction_static={cfg.mem_fraction}, "
            f"max_running_requests={cfg.max_running}, random_seed={cfg.seed})")
        log(f"KV Cache is allocated. #tokens: {capacity}, KV size: {kv_gib:.2f} GB")
    if capacity <= 0:
        log("No available memory for the cache blocks. Try increasing the memory fraction "
            "when initializing the engine.", level="ERROR")
        return 1
    max_model_len = cfg.max_model_len
    if capacity < max_model_len:
        if cfg.engine == "vllm":
            need = max_model_len * cfg.kv_bytes_per_gpu_token / cfg.dcp_size / gib
            log(f"ValueError: To serve at least one request with the models's max seq len "
                f"({max_model_len}), {need:.2f}"
                f" GiB KV cache is needed, which is larger than the available KV cache memory "
                f"({kv_gib:.2f} GiB). Try increasing `gpu_memory_utilization` or decreasing "
                f"`max_model_len` when initializing the engine.", level="ERROR")
            return 1
        log(f"context_len={max_model_len} exceeds max_total_num_tokens={capacity}; "
            f"clamping context_len to {capacity}")
        max_model_len = capacity
    if cfg.engine == "vllm":
        log(f"Maximum concurrency for {max_model_len:,} tokens per request: "
            f"{capacity / max_model_len:.2f}x", where="kv_cache_utils.py")
    else:
        free = gpu.memory_bytes * (1 - cfg.mem_fraction) / gib
        log(f"max_total_num_tokens={capacity}, chunked_prefill_size=8192, max_prefill_tokens=16384,"
            f" max_running_requests={cfg.max_running}, context_len={max_model_len}, "
            f"available_gpu_mem={free:.2f} GB")
    if cfg.oom_active and cfg.oom_on_startup:
        log("Capturing CUDA graphs (mixed prefill-decode, FULL) ...", where="gpu_model_runner.py")
        time.sleep(cfg.startup_seconds)
        log(f"torch.OutOfMemoryError: {oom_message(gpu.memory_bytes, cfg.mem_fraction)}",
            level="ERROR", where="core.py")
        log(f"Engine core initialization failed: memory fraction {cfg.mem_fraction} >= "
            f"{cfg.oom_threshold} left no room for CUDA graphs.", level="ERROR", where="core.py")
        return 1
    try:
        timer = StepTimer(model, cfg.engine, gpu, cfg.shape(), cfg.num_gpus, cfg.dcp_size)
    except ValueError as exc:
        log(str(exc), level="ERROR")
        return 1
    if cfg.oom_active:
        log(f"memory fraction {cfg.mem_fraction} >= {cfg.oom_threshold}: about "
            f"{cfg.oom_rate:.0%} of requests will fail with CUDA out of memory", level="WARNING")

    def ready_log(_: str) -> None:
        if cfg.engine == "vllm":
            log(f"Starting vLLM API server on http://{cfg.host}:{cfg.port}", where="launcher.py")
        else:
            log("The server is fired up and ready to roll!")

    if tok is not BUILTIN:
        log(f"tokenizer: {tok.name} ({tok.vocab_size} tokens)")
    state = SimState(cfg, timer, capacity, max_model_len, ready_log, tok, note=log)
    app = create_app(state)

    import uvicorn

    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level="info",
                            access_log=False, lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    try:
        server.run()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0 if server.started else 1


if __name__ == "__main__":   # pragma: no cover
    sys.exit("run `engine-advisor sim`")
