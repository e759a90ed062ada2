"""The settings of a ``calibrate run`` sweep: what it measures (an engine over contexts x batch
sizes x repeats, per (DCP size, memory fraction) combination), how it reaches the engine
(``--url`` or ``--launch``), which of them make two runs the same sweep (``identity``: a run folder
resumes only the sweep it holds), and their checks (``validate``). ``read_hf_config`` reads the
config.json a flag names.

The sweep itself: engine_advisor.calibration.sweep.driver.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_advisor.calibration.sweep.launcher import format_command
from engine_advisor.calibration.sweep.runstore import PointKey
from engine_advisor.calibration.sweep.served_model import (
    ServedModel,
    config_key,
    resolve_served_model,
)

IDENTITY = ("engine", "model", "contexts", "output_tokens", "batch_sizes", "repeats",
            "dcp_sizes", "mem_fractions", "gpu", "num_gpus", "kv_bytes_per_token", "kv_shards",
            "prompt", "seed", "mode")
# parameters added later: part of a sweep's identity only when given (older folders resume)
OPTIONAL_IDENTITY = ("preset", "hf_config", "kv_cache_dtype", "load_format")


@dataclass
class SweepConfig:
    engine: str
    contexts: list[int]
    kv_bytes_per_token: int | None      # None: from the architecture
    out: str
    url: str | None = None
    launch: str | None = None
    model: str | None = None
    output_tokens: int = 256
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    repeats: int = 1
    dcp_sizes: list[int] = field(default_factory=lambda: [1])
    mem_fractions: list[float] = field(default_factory=lambda: [0.9])
    gpu: str = "B300"
    num_gpus: int = 8
    kv_shards: int | None = None        # None: from the architecture, else 1
    prompt: str = "token-ids"
    seed: int = 0
    request_timeout: float = 600.0
    retries: int = 2
    max_failed_points: int = 3
    port: int = 0
    startup_timeout: float = 1800.0
    stop_grace: float = 30.0
    progress: bool = True
    preset: str | None = None
    hf_config: dict[str, Any] | None = None     # a config.json's contents
    kv_cache_dtype: str | None = None           # bf16 | fp8; None: bf16 unless the bytes say fp8
    load_format: str | None = None              # dummy | real; None: what the engine states
    engine_log: str | None = None               # --url: the engine's log file
    warmup: bool = True

    @property
    def mode(self) -> str:
        return "launch" if self.launch else "url"

    def identity(self) -> dict[str, Any]:
        """The parameters that make two runs the same sweep (how the engine is reached and the
        timeouts may change between resumptions)."""
        d = {k: getattr(self, k) for k in IDENTITY}
        d["gpu"] = self.gpu.upper()
        if d["kv_shards"] is None:
            d["kv_shards"] = 1
        for k in OPTIONAL_IDENTITY:
            v = getattr(self, k)
            if v is not None:
                d[k] = config_key(v) if k == "hf_config" else v
        return d

    def served_upfront(self) -> ServedModel | None:
        """The served model when the flags name it (``--preset``, ``--hf-config``, or
        ``--model``); else None (resolved from ``/v1/models``). Raises
        ``ServedModelError`` naming the flag."""
        if self.preset is None and self.hf_config is None and not self.model:
            return None
        return resolve_served_model(
            preset_name=self.preset, hf_config=self.hf_config, model_id=self.model,
            kv_bytes_per_token=self.kv_bytes_per_token, kv_cache_dtype=self.kv_cache_dtype,
            kv_shards=self.kv_shards, num_gpus=self.num_gpus)

    def combos(self) -> list[tuple[int, float]]:
        return list(itertools.product(self.dcp_sizes, self.mem_fractions))

    def points(self, dcp: int, mem: float) -> list[PointKey]:
        return [PointKey(self.engine, dcp, mem, ctx, b, self.output_tokens, rep)
                for rep in range(self.repeats) for ctx in self.contexts for b in self.batch_sizes]

    def validate(self) -> None:
        if self.url and (len(self.dcp_sizes) > 1 or len(self.mem_fractions) > 1):
            raise ValueError("--url reaches one running engine: give one --dcp-size and one "
                             "--mem-fraction (lists need --launch)")
        if bad := [d for d in self.dcp_sizes if self.num_gpus % d]:
            raise ValueError(f"--dcp-size: {bad} do not divide --num-gpus {self.num_gpus}")
        if self.retries < 0:
            raise ValueError("--retries: must be >= 0")
        if self.engine_log and self.launch:
            raise ValueError("--engine-log: only with --url (--launch reads the log of the "
                             "engine it starts)")
        if self.load_format not in (None, "dummy", "real"):
            raise ValueError(f"--load-format: expected dummy or real, got {self.load_format!r}")
        if self.launch and not (self.model or self.preset or self.hf_config
                                or self.kv_bytes_per_token):
            raise ValueError("--kv-bytes-per-token: required with --launch unless --preset, "
                             "--hf-config or a --model naming a known architecture says it")
        self.served_upfront()
        if self.launch:
            format_command(self.launch, **self._placeholders(1, 0.9, 8000))
        from engine_advisor.model.hardware.gpus import builtin_gpu
        try:
            builtin_gpu(self.gpu)
        except KeyError:
            raise ValueError(f"--gpu: unknown GPU {self.gpu!r} (no bandwidth known to fit "
                             "its rows)") from None

    def _placeholders(self, dcp: int, mem: float, port: int) -> dict[str, object]:
        return {"model": self.model or self.preset or "MODEL", "num_gpus": self.num_gpus,
                "tp": self.num_gpus, "dcp_size": dcp, "mem_fraction": f"{mem:g}", "port": port}



def read_hf_config(path: str | None, flag: str = "--hf-config") -> dict[str, Any] | None:
    """The contents of a config.json named by a flag; ``ValueError`` naming the flag."""
    if path is None:
        return None
    import json
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{flag}: cannot read {path} ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{flag}: {path} is not a JSON object (a config.json)")
    return config
