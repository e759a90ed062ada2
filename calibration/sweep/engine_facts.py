"""``EngineFacts``: what an engine says about itself (KV capacity, memory split, chunk size,
prefix caching, load format, backends, running-request limit, a hybrid model's state pool, and
the JIT compiles it reports while serving), each fact with the source that stated it; merged
across sources, and read from and written to a run's manifest.

Each source has its parser, which fills in only what the source states: an engine's start-up
log (``engine_advisor.calibration.sweep.engine_logs``), its ``/metrics`` and SGLang's server
info (``engine_advisor.calibration.sweep.engine_endpoints``), the launch command, and all of them
at once (``engine_advisor.calibration.sweep.engine_sources``); its JIT compiles
(``engine_advisor.calibration.sweep.engine_jit``). SGLang's "GB" are GiB (it divides by 2**30),
so every memory figure here is in GiB.

The running-request limit comes twice: ``max_running_requested`` as launched (None: the
engine's default) and ``max_running`` as the engine runs with it. vLLM runs with its
``--max-num-seqs`` and does not log its default (None when not given); SGLang may lower the
request to what its KV and state pools hold, and logs the result (per DP worker).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any

from engine_advisor.calibration.sweep.engine_jit import JitEvent

FACT_FIELDS = ("kv_capacity_tokens", "kv_cache_gib", "weights_gib", "peak_activation_gib",
               "non_torch_gib", "cuda_graph_gib", "gpu_total_gib", "free_at_start_gib",
               "free_after_pool_gib", "chunk_tokens", "max_prefill_tokens", "prefix_caching",
               "block_size", "num_gpu_blocks", "mem_fraction", "load_format", "kv_cache_dtype",
               "attention_backend", "moe_backend", "version", "max_model_len", "max_running",
               "max_running_requested", "state_slots", "state_pool_gib", "max_concurrency")


@dataclass
class EngineFacts:
    """Facts one or more sources stated (None: not stated). Memory in GiB."""

    kv_capacity_tokens: int | None = None
    kv_cache_gib: float | None = None
    weights_gib: float | None = None
    peak_activation_gib: float | None = None
    non_torch_gib: float | None = None
    cuda_graph_gib: float | None = None
    gpu_total_gib: float | None = None
    free_at_start_gib: float | None = None
    free_after_pool_gib: float | None = None   # SGLang: left after weights and KV pool
    chunk_tokens: int | None = None            # prefill tokens per step (chunked prefill)
    max_prefill_tokens: int | None = None
    prefix_caching: bool | None = None
    block_size: int | None = None              # vLLM: tokens per KV block (a hybrid's attention)
    num_gpu_blocks: int | None = None
    mem_fraction: float | None = None
    load_format: str | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    moe_backend: str | None = None
    version: str | None = None
    max_model_len: int | None = None
    max_running: int | None = None             # running-request limit the engine runs with
    max_running_requested: int | None = None   # the limit as launched (None: the default)
    state_slots: int | None = None             # SGLang hybrid: the Mamba state pool's slots
    state_pool_gib: float | None = None        # SGLang hybrid: the state pool (conv + ssm)
    max_concurrency: float | None = None       # vLLM: requests of max_model_len the KV holds
    sources: dict[str, str] = field(default_factory=dict)   # fact -> where it came from
    jit: list[JitEvent] = field(default_factory=list)

    def _set(self, name: str, value: Any, source: str) -> None:
        if value is not None:
            setattr(self, name, value)
            self.sources[name] = source

    def merged(self, other: EngineFacts) -> EngineFacts:
        """These facts, with ``other``'s filling what these lack."""
        out = EngineFacts()
        for name in FACT_FIELDS:
            mine = getattr(self, name)
            if mine is not None:
                out._set(name, mine, self.sources.get(name, ""))
            else:
                out._set(name, getattr(other, name), other.sources.get(name, ""))
        seen = set()
        for ev in [*self.jit, *other.jit]:
            if (ev.kernel, ev.log_time) not in seen:
                seen.add((ev.kernel, ev.log_time))
                out.jit.append(ev)
        return out

    @property
    def empty(self) -> bool:
        return all(getattr(self, n) is None for n in FACT_FIELDS) and not self.jit

    @property
    def dummy_weights(self) -> bool | None:
        """True for ``--load-format dummy``, False for a checkpoint, None when not stated."""
        if self.load_format is None:
            return None
        return self.load_format.lower() == "dummy"

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {n: getattr(self, n) for n in FACT_FIELDS
                             if getattr(self, n) is not None}
        d["sources"] = dict(sorted(self.sources.items()))
        if self.jit:
            d["jit"] = [e.to_json() for e in self.jit]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> EngineFacts:
        out = cls()
        if not isinstance(d, dict):
            return out
        types = {f.name: f.type for f in fields(cls)}
        for name in FACT_FIELDS:
            v = d.get(name)
            if v is None:
                continue
            kind = types[name]
            ok = (("int" in kind and isinstance(v, int) and not isinstance(v, bool))
                  or ("float" in kind and isinstance(v, int | float) and not isinstance(v, bool))
                  or ("bool" in kind and isinstance(v, bool))
                  or ("str" in kind and isinstance(v, str)))
            if ok:
                out._set(name, v, str((d.get("sources") or {}).get(name, "manifest")))
        for e in d.get("jit") or []:
            if isinstance(e, dict) and isinstance(e.get("kernel"), str):
                out.jit.append(JitEvent(e["kernel"], str(e.get("log_time", ""))))
        return out


def stated_bool(text: str) -> bool | None:
    """``True`` or ``False`` as a log line or a metric label states it (quoted or not); None for
    anything else."""
    t = text.strip().strip("'\"").lower()
    return True if t == "true" else False if t == "false" else None


def last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The last match of ``pattern`` in a log: a log holding several starts describes the
    last one."""
    matches = list(pattern.finditer(text))
    return matches[-1] if matches else None
