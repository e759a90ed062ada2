"""Start the simulator: engine-like startup log lines, memory checks, then uvicorn."""

from __future__ import annotations

import datetime as dt
import sys
import time

from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.sim import engines
from engine_advisor.sim.app import create_app
from engine_advisor.sim.config import SimConfig
from engine_advisor.sim.faults import oom_message
from engine_advisor.sim.state import SimState
from engine_advisor.sim.timing import StepTimer
from engine_advisor.sim.tokenizer import BUILTIN, Tokenizer


def _logger(engine: engines.SimEngine):
    def log(message: str, level: str = "INFO", where: str = "simulator") -> None:
        print(engine.log_line(dt.datetime.now(), level, where, message), flush=True)
    return log


def serve(cfg: SimConfig, model: CostModel, tok: Tokenizer = BUILTIN) -> int:
    """Run until interrupted; the exit status is non-zero when startup fails like an engine."""
    engine = engines.get(cfg.engine)
    log = _logger(engine)
    gpu = cfg.gpu_spec
    pool = cfg.pool()           # the recommender's memory of this instance
    capacity = pool.capacity_tokens
    engine.startup(log, cfg, pool)
    if capacity <= 0:
        log("No available memory for the cache blocks. Try increasing the memory fraction "
            "when initializing the engine.", level="ERROR")
        return 1
    if pool.max_running < 1:
        log("Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
            "Try increasing --mamba-full-memory-ratio or --max-mamba-cache-size.",
            level="ERROR")
        return 1
    max_model_len = cfg.max_model_len
    if capacity < max_model_len or not pool.holds(max_model_len):
        clamped = engine.too_long(log, cfg, pool)
        if clamped is None:
            return 1
        max_model_len = clamped
    engine.limits(log, cfg, pool, max_model_len)
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
    if timer.priors_only:
        log(f"engine-advisor sim: the cost model has no data for {cfg.engine} (it has "
            f"{', '.join(model.engine_names)}): step times are its physics priors, uncalibrated",
            level="WARNING")
    if cfg.oom_active:
        log(f"memory fraction {cfg.mem_fraction} >= {cfg.oom_threshold}: about "
            f"{cfg.oom_rate:.0%} of requests will fail with CUDA out of memory", level="WARNING")

    def ready_log(_: str) -> None:
        engine.ready(log, cfg)

    if tok is not BUILTIN:
        log(f"tokenizer: {tok.name} ({tok.vocab_size} tokens)")
    state = SimState(cfg, timer, pool, max_model_len, ready_log, tok, note=log)
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
