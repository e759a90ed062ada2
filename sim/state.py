"""The running simulator's state, shared by its routes: its settings, the engine it imitates,
the engine core, fault injection, readiness, and what it says of its own server.

Built by engine_advisor.sim.server; its routes: engine_advisor.sim.app (the OpenAI endpoints and
the engines' own) and engine_advisor.sim.native (SGLang's native API).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engine_advisor.model.engines.sglang import STATE_RATIO
from engine_advisor.model.physics.capacity import Pool
from engine_advisor.sim import engines
from engine_advisor.sim.config import SimConfig
from engine_advisor.sim.engine import EngineCore
from engine_advisor.sim.faults import FaultInjector, oom_message
from engine_advisor.sim.prefix import PrefixCache
from engine_advisor.sim.textgen import Vocab
from engine_advisor.sim.timing import StepTimer
from engine_advisor.sim.tokenizer import BUILTIN, Tokenizer


class SimState:
    """Everything the routes share: settings, the engine core, fault injection, readiness."""

    def __init__(self, cfg: SimConfig, timer: StepTimer, pool: Pool, max_model_len: int,
                 log: Callable[[str], None], tok: Tokenizer = BUILTIN,
                 note: Callable[[str], None] | None = None):
        self.cfg = cfg
        self.engine = engines.get(cfg.engine)
        self.tok = tok
        self.vocab = Vocab(tok)
        self.note = note or (lambda _: None)
        self.time_resolution: dict[str, Any] | None = None
        self.timer = timer
        self.pool = pool                     # the engine's memory (SimConfig.pool)
        self.capacity = pool.capacity_tokens
        self.max_model_len = max_model_len
        self.log = log
        self.core: EngineCore | None = None
        self.ready = False
        self.started = time.time()
        self.in_flight = 0
        self.prefix_caching = self.engine.prefix_caching(cfg, pool)
        self.prefix = PrefixCache(self.capacity, enabled=self.prefix_caching)
        self.faults = FaultInjector(fail_rate=cfg.fail_rate, oom_active=cfg.oom_active,
                                    oom_rate=cfg.oom_rate, seed=cfg.seed,
                                    oom_text=oom_message(cfg.gpu_spec.memory_bytes,
                                                         cfg.mem_fraction))

    def server_args(self) -> dict[str, Any]:
        """Server arguments under the names the engine uses (SGLang /get_server_info)."""
        c = self.cfg
        return {"model_path": c.model_name, "tokenizer_path": c.model_name,
                "served_model_name": c.model_name, "host": c.host, "port": c.port,
                "tp_size": c.num_gpus, "dp_size": 1, "pp_size": 1, "dcp_size": c.dcp_size,
                "decode_context_parallel_size": c.dcp_size,
                "mem_fraction_static": c.mem_fraction, "max_running_requests": c.max_running,
                "max_mamba_cache_size": c.max_mamba_cache_size,
                "mamba_full_memory_ratio": c.mamba_full_memory_ratio or STATE_RATIO,
                "max_total_num_tokens": self.capacity, "context_length": self.max_model_len,
                "random_seed": c.seed, "enable_metrics": True,
                "disable_radix_cache": c.disable_prefix_caching,
                "chunked_prefill_size": 8192, "kv_cache_dtype": "auto",
                "device": "cuda", "gpu": c.gpu_spec.name, "version": self.engine.version}

    def sim_info(self) -> dict[str, Any]:
        return {"engine": self.cfg.engine, "version": self.engine.version,
                "kv_capacity_tokens": self.capacity, "max_model_len": self.max_model_len,
                "max_running_requests": self.pool.max_running,
                "state_slots": self.pool.state_slots or None,
                "oom_active": self.cfg.oom_active, "ready": self.ready,
                "tokenizer": self.tok.name, "time_resolution": self.time_resolution,
                "cost_model_version": self.timer.model.version, "config": self.cfg.as_dict()}
