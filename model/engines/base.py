"""What the rest of engine-advisor knows about one serving engine: the ``Engine`` record.

Every field is a fact of the engine's own documentation or of its real start-up logs; each
engine module (``model.engines.vllm``, ``model.engines.sglang``) fills one in, and
``model.engines`` registers it. Nothing here depends on the rest of ``model``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

GIB = 2 ** 30


class PrefixReuse(BaseModel):
    kind: str
    block_tokens: int = Field(ge=1, description="granularity of cache hits: a cached prefix "
                              "counts in whole blocks of this many tokens")


class Incompatibility(BaseModel):
    when: list[str] = Field(min_length=2)
    reason: str


class EngineCapabilities(BaseModel):
    """What an engine supports, as its documentation lists it; anything absent is unsupported
    (``model.predict.capabilities`` turns a workload's requirements into exclusions with it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hardware_vendors: list[str]
    quantization: list[str]
    speculative_methods: list[str]
    lora: bool
    pipeline_parallel: bool
    dp_attention: bool
    prefix_reuse: PrefixReuse
    incompatible: list[Incompatibility] = []


@dataclass(frozen=True)
class Metrics:
    """The Prometheus names an engine's ``/metrics`` exposes for what a router reads (gauges)
    and what a benchmark compares (histograms, counters)."""

    running: str                 # requests in the running batch (gauge)
    waiting: str                 # requests queued (gauge)
    kv_usage: str                # KV cache in use, 0 .. 1 (gauge)
    ttft: str                    # time to first token (histogram, seconds)
    inter_token: str             # gaps between output tokens (histogram, seconds)
    e2e: str                     # request latency (histogram, seconds)
    prompt_tokens: str           # prefill tokens processed (counter)
    generation_tokens: str       # output tokens generated (counter)
    prefixes: tuple[str, ...]    # name prefixes the engine has used (newer and older releases)


@dataclass(frozen=True)
class Engine:
    """One serving engine. See model/engines/README.md for what each field means."""

    name: str                    # the contract's name ("vllm"): Workload.engines, CSV rows
    label: str                   # how reasons and logs spell it ("vLLM")
    # launch command: ``program`` then the model (after ``model_flag``, or positional when
    # None), then each flag with its value
    program: tuple[str, ...]
    model_flag: str | None
    tp_flag: str
    dcp_flag: str                # decode context parallel size (written when dcp > 1)
    max_running_flag: str        # most sequences running at once
    kv_dtype_flag: str
    kv_dtype_values: dict[str, str]   # KvDtype -> the flag's value (bf16 is the default: none)
    # memory: the fraction's flag and what its budget covers
    mem_flag: str
    mem_covers: str
    reserve_bytes: float         # per GPU, spent by the fraction outside weights, KV, activations
    counts_activations: bool     # the fraction's budget also holds the activation peak
    # decode context parallelism: the attention kinds (ModelShape.attention) it stripes
    dcp_attention: frozenset[str]
    # prefill passes replayed as CUDA graphs: the largest pass (tokens) captured, and the
    # attention kinds (ModelShape.attention) whose prefill the engine captures
    prefill_graph_tokens: int
    prefill_graph_attention: frozenset[str]
    capabilities: EngineCapabilities
    metrics: Metrics
    # HTTP surface and deployment
    info_paths: tuple[str, ...]  # GET paths that state the engine's version and settings
    image: str                   # container image repository
    port: int                    # the OpenAI server's default port

    def launch_command(self, model: str, tp: int, dcp: int, fraction: float,
                       max_running: int | None = None, kv_dtype: str = "bf16") -> list[str]:
        """The engine's command line for one instance: TP ``tp``, DCP ``dcp`` (flag only when
        > 1), memory fraction to two decimals, ``max_running`` sequences when given and a KV
        cache dtype other than the default."""
        cmd = [*self.program, *((self.model_flag,) if self.model_flag else ()), model,
               self.tp_flag, str(tp)]
        if dcp > 1:
            cmd += [self.dcp_flag, str(dcp)]
        cmd += [self.mem_flag, f"{fraction:.2f}"]
        if max_running is not None:
            cmd += [self.max_running_flag, str(max_running)]
        if kv_dtype in self.kv_dtype_values:
            cmd += [self.kv_dtype_flag, self.kv_dtype_values[kv_dtype]]
        return cmd

    def reserve(self, activation_bytes: float = 0.0) -> float:
        """Bytes per GPU the memory fraction spends outside weights and KV: the engine's
        reserve, plus the activation peak when its budget holds it."""
        return self.reserve_bytes + (activation_bytes if self.counts_activations else 0.0)

    def graphed_prefill_tokens(self, attention: str) -> int:
        """The largest prefill pass (tokens) the engine replays as a captured CUDA graph for
        a model with this attention (``ModelShape.attention``); 0 when it launches every pass
        kernel by kernel. A graphed pass pays no launch-bound fixed costs
        (``model.formulas.prefill_into``)."""
        return self.prefill_graph_tokens if attention in self.prefill_graph_attention else 0

    def dcp_constraint(self, dcp: int, tp: int, attention: str, kv_heads: int) -> str | None:
        """Why DCP ``dcp`` cannot run with TP ``tp`` on a model with this attention
        (``ModelShape.attention``: mla, gqa, mha, unknown) and KV heads, or None. DCP stripes
        a TP group's KV over ``dcp`` ranks, so ``dcp`` divides ``tp``; GQA/MHA KV heads
        replicated over the TP group must be replicated a multiple of ``dcp`` times."""
        if tp % dcp:
            return f"dcp {dcp} does not divide the tensor-parallel size {tp}"
        if dcp == 1 or attention == "unknown":
            return None
        if attention in ("gqa", "mha"):
            if attention not in self.dcp_attention:
                return (f"{self.label} implements DCP for MLA attention only; this model uses "
                        "GQA")
            replicas = tp // kv_heads if kv_heads and kv_heads < tp else 1
            if replicas % dcp:
                return (f"{self.label} needs (tp // kv_heads) % dcp == 0: KV heads {kv_heads} "
                        f"on tp {tp} are replicated {replicas}x, so dcp {dcp} cannot stripe "
                        "them")
        return None
