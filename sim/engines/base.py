"""How the simulator imitates one engine: its version string, HTTP quirks, log lines and
``/metrics`` text. The engine's own facts (name, label, flags, metric names) come from its
``engine_advisor.model.engines`` record; what is here is only what the simulator needs to look like
it.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING

from engine_advisor.model.engines.base import NO_STATE, Engine

if TYPE_CHECKING:
    from engine_advisor.model.physics.capacity import Pool
    from engine_advisor.sim.config import SimConfig
    from engine_advisor.sim.engine import EngineCore

GIB = 1024 ** 3


def hybrid(pool: Pool) -> bool:
    """Whether the engine lays out a linear-attention state pool beside the KV cache."""
    return pool.layout.mode != NO_STATE


def kv_gib(cfg: SimConfig, pool: Pool) -> float:
    """GiB of KV cache one GPU holds: the pool's tokens at the served model's KV bytes per GPU
    token (DCP stripes them over ``dcp`` ranks)."""
    return pool.capacity_tokens * cfg.kv_bytes_per_gpu_token / cfg.dcp_size / GIB


def longest(pool: Pool) -> int:
    """The most tokens (prompt and output) one request can hold, alone in the pool."""
    if pool.attn_units <= 0 or pool.units < pool.fixed_units:
        return 0
    return int((pool.units - pool.fixed_units) // pool.attn_units * pool.unit_tokens)


class SimEngine:
    """One imitated engine. Subclasses set the data and write the engine-specific lines."""

    engine: Engine                  # the engine_advisor.model.engines record
    version: str                    # what /version, /get_server_info and the log report
    flat_errors: bool               # non-stream errors as {"object": "error", ...} (else nested)
    prefixed_ids: bool              # response ids "chatcmpl-..." / "cmpl-..." (else bare hex)
    checks_model_name: bool         # 404 for a "model" other than the served one
    batch_tokenize: bool            # /tokenize takes a list of texts, /detokenize lists of ids
    detokenize_key: str             # the /detokenize answer's text field
    # extra GET/POST routes: (path, handler name in engine_advisor.sim.app.create_app, method)
    routes: tuple[tuple[str, str, str], ...]
    native_api: bool                # the engine's native API (sim/native.py: /generate ...)
    tokenize: bool = True           # serves /tokenize and /detokenize (TensorRT-LLM does not)
    json_metrics: bool = False      # GET /metrics answers JSON (``iteration_stats``), not text
    health_generate_text: str = ""  # the body of a good /health_generate

    @property
    def name(self) -> str:
        return self.engine.name

    # ---------------------------------------------------------------- logs
    def log_line(self, now: dt.datetime, level: str, where: str, message: str) -> str:
        raise NotImplementedError

    def startup(self, log, cfg: SimConfig, pool: Pool) -> None:
        """The lines an engine prints once it has sized its KV cache (and a hybrid's state)
        as ``pool`` (``SimConfig.pool``)."""
        raise NotImplementedError

    def too_long(self, log, cfg: SimConfig, pool: Pool) -> int | None:
        """When ``cfg.max_model_len`` exceeds the KV capacity: the context length the engine
        clamps to, or None when it refuses to start (after logging why)."""
        raise NotImplementedError

    def limits(self, log, cfg: SimConfig, pool: Pool, max_model_len: int) -> None:
        """The lines stating how much the instance holds at once."""
        raise NotImplementedError

    def ready(self, log, cfg: SimConfig) -> None:
        raise NotImplementedError

    def slots_per_request(self, cfg: SimConfig, pool: Pool) -> int:
        """State slots of a separate state pool one running request holds (0: none)."""
        return 0

    def prefix_caching(self, cfg: SimConfig, pool: Pool) -> bool:
        """Whether the engine caches prompt prefixes (``--disable-prefix-caching`` turns it
        off)."""
        return not cfg.disable_prefix_caching

    # ---------------------------------------------------------------- metrics
    def attach(self, core: EngineCore, cfg: SimConfig) -> None:
        """Called once the engine core exists (before it serves): an engine that records
        per-iteration statistics hooks ``core.on_step`` here."""

    def iteration_stats(self, core: EngineCore) -> list:
        """The JSON ``/metrics`` answer of an engine with ``json_metrics``."""
        return []

    def cache_info(self, pool: Pool, max_model_len: int) -> dict[str, str]:
        """Labels of the engine's cache-configuration metric that follow from its pool."""
        return {}

    def metric_lines(self, out: list[str], core: EngineCore, labels: str,
                     info: dict[str, str], now: float) -> None:
        raise NotImplementedError

    def render_metrics(self, core: EngineCore, model_name: str, info: dict[str, str]) -> str:
        """The /metrics text: Prometheus exposition under the engine's names."""
        safe_name = model_name.replace("\\", "\\\\").replace('"', '\\"')
        out: list[str] = []
        self.metric_lines(out, core, f'model_name="{safe_name}"', info, time.monotonic())
        return "\n".join(out) + "\n"
