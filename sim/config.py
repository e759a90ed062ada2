"""The simulator's settings (one object built from the CLI) and what follows from them.

The engine is one of the cost model's (engine_advisor.model.engines); which of them the simulator
imitates, and how, is engine_advisor.sim.engines, which reads these settings (this module imports
nothing of it)."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

from engine_advisor.model import engines
from engine_advisor.model.engines.base import MemoryKnobs
from engine_advisor.model.hardware.gpus import BUILTIN_GPUS, GpuSpec
from engine_advisor.model.physics.capacity import Pool, instance_pool
from engine_advisor.model.physics.memory import OOM_THRESHOLD
from engine_advisor.model.physics.shape import ModelShape

DEFAULT_KV_BYTES = 27_648        # Kimi-K3 (the default --model-name): 24 MLA layers x 576 x 2 B


@dataclass
class SimConfig:
    engine: str = "vllm"
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "kimi-k3"
    gpu: str = "B300"
    num_gpus: int = 8
    dcp_size: int = 1
    mem_fraction: float = 0.9
    kv_bytes_per_token: int = DEFAULT_KV_BYTES
    kv_shards: int = 1
    weight_bytes: float | None = None
    model_artifact: str | None = None
    time_scale: float = 1.0
    # memory knobs as the engines spell them (None: the engine's default)
    max_running: int | None = None           # vLLM --max-num-seqs, SGLang --max-running-requests
    max_mamba_cache_size: int | None = None  # SGLang's state slots
    mamba_full_memory_ratio: float | None = None   # SGLang's state : KV memory ratio
    max_model_len: int = 262_144
    fail_rate: float = 0.0
    startup_seconds: float = 0.0
    seed: int = 0
    oom_threshold: float = OOM_THRESHOLD
    oom_rate: float = 0.05
    oom_on_startup: bool = False
    disable_prefix_caching: bool = False     # SGLang --disable-radix-cache
    tokenizer: str | None = None
    admit_window_ms: float = 0.0
    custom_gpu: dict | None = None      # a GpuSpec's fields (--gpu-spec), instead of --gpu

    def problems(self) -> list[str]:
        """'--flag: reason' for each invalid setting."""
        p = []
        if self.engine not in engines.REGISTRY:
            p.append(f"--engine: {self.engine!r} is not {' or '.join(engines.names())}")
        if not 0 < self.port < 65536:
            p.append(f"--port: {self.port} is not a TCP port (1 .. 65535)")
        if not self.model_name or len(self.model_name) > 256:
            p.append("--model-name: must be 1 .. 256 characters")
        if self.custom_gpu is None and self.gpu.upper() not in BUILTIN_GPUS:
            p.append(f"--gpu: unknown GPU {self.gpu!r}; built in: "
                     f"{', '.join(BUILTIN_GPUS)}; or describe it with --gpu-spec")
        if not 1 <= self.num_gpus <= 1024:
            p.append(f"--num-gpus: {self.num_gpus} is outside 1 .. 1024")
        elif not 1 <= self.dcp_size <= self.num_gpus or self.num_gpus % self.dcp_size:
            p.append(f"--dcp-size: {self.dcp_size} must divide --num-gpus {self.num_gpus}")
        if not 0 < self.mem_fraction <= 1:
            p.append(f"--mem-fraction: {self.mem_fraction} is outside (0, 1]")
        if not 0 < self.kv_bytes_per_token <= 1 << 26:
            p.append(f"--kv-bytes-per-token: {self.kv_bytes_per_token} is outside 1 .. 2^26")
        if not 1 <= self.kv_shards <= self.num_gpus:
            p.append(f"--kv-shards: {self.kv_shards} is outside 1 .. --num-gpus")
        if self.weight_bytes is not None and not 0 <= self.weight_bytes < 1e14:
            p.append(f"--weight-bytes: {self.weight_bytes} is outside 0 .. 1e14")
        if not 1e-6 <= self.time_scale <= 1e3:
            p.append(f"--time-scale: {self.time_scale} is outside 1e-6 .. 1000")
        if self.max_running is not None and not 1 <= self.max_running <= 65536:
            p.append(f"--max-running: {self.max_running} is outside 1 .. 65536")
        slots = self.max_mamba_cache_size
        if slots is not None and not 1 <= slots <= 1 << 24:
            p.append(f"--max-mamba-cache-size: {slots} is outside 1 .. 16777216")
        r = self.mamba_full_memory_ratio
        if r is not None and not 0 < r <= 10:     # NaN included
            p.append(f"--mamba-full-memory-ratio: {r} is outside (0, 10]")
        if self.engine != "sglang":
            for flag, v in (("--max-mamba-cache-size", slots), ("--mamba-full-memory-ratio", r)):
                if v is not None:
                    p.append(f"{flag}: SGLang's flag; {self.engine} has no separate state pool")
        if not 16 <= self.max_model_len <= 16_777_216:
            p.append(f"--max-model-len: {self.max_model_len} is outside 16 .. 16777216")
        for flag, v in (("--fail-rate", self.fail_rate), ("--oom-rate", self.oom_rate)):
            if not 0 <= v <= 1:
                p.append(f"{flag}: {v} is outside 0 .. 1")
        if not 0 < self.oom_threshold <= 1:
            p.append(f"--oom-threshold: {self.oom_threshold} is outside (0, 1]")
        if not 0 <= self.admit_window_ms <= 10_000:
            p.append(f"--admit-window-ms: {self.admit_window_ms} is outside 0 .. 10000")
        if self.tokenizer is not None and not Path(self.tokenizer).is_file():
            p.append(f"--tokenizer: {self.tokenizer} is not a file (a Hugging Face "
                     "tokenizer.json)")
        if not 0 <= self.startup_seconds <= 3600:
            p.append(f"--startup-seconds: {self.startup_seconds} is outside 0 .. 3600")
        return p

    @property
    def gpu_spec(self) -> GpuSpec:
        if self.custom_gpu is not None:
            return GpuSpec.model_validate(self.custom_gpu)
        return BUILTIN_GPUS[self.gpu.upper()]

    @property
    def oom_active(self) -> bool:
        return self.mem_fraction >= self.oom_threshold

    @property
    def kv_bytes_per_gpu_token(self) -> float:
        """KV bytes per token one GPU holds before DCP (the served model's, on --num-gpus)."""
        return self.shape().kv_gpu_token_bytes(self.num_gpus)

    def shape(self) -> ModelShape:
        """The served model: the preset --model-name names when its KV bytes per token match
        --kv-bytes-per-token (weights and FLOPs known), else the KV bytes alone."""
        from engine_advisor.model.physics.shape import shape_of

        try:
            return shape_of(self.model_name, "bf16", self.kv_bytes_per_token, self.kv_shards)
        except ValueError:
            return shape_of("", "bf16", self.kv_bytes_per_token, self.kv_shards)

    def knobs(self) -> MemoryKnobs:
        """The engine's memory knobs as launched (``engine_advisor.model.engines.base.MemoryKnobs``;
        unset: the engine's default). SGLang's state slots, state ratio and radix cache apply to
        SGLang only; vLLM's prefix caching does not change its pool (off for hybrids)."""
        sglang = self.engine == "sglang"
        return MemoryKnobs(
            max_running=self.max_running or 0,
            state_slots=(self.max_mamba_cache_size or 0) if sglang else 0,
            no_prefix_cache=self.disable_prefix_caching and sglang,
            state_ratio=(self.mamba_full_memory_ratio or 0.0) if sglang else 0.0)

    def pool(self) -> Pool:
        """The instance's memory as the recommender models it
        (``engine_advisor.model.physics.capacity.instance_pool``: weights, the engine's reserve, its
        layout of a hybrid's state and KV, the running-request limit)."""
        shape = self.shape()
        if self.weight_bytes is not None:
            shape = dataclasses.replace(shape, weight_bytes=self.weight_bytes)
        return instance_pool(self.engine, self.mem_fraction, self.gpu_spec, shape,
                             self.num_gpus, self.dcp_size, self.knobs())

    def kv_capacity(self) -> int:
        """KV tokens the instance reports (``pool().capacity_tokens``)."""
        return self.pool().capacity_tokens

    def as_dict(self) -> dict:
        return asdict(self)
