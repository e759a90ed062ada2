"""What the rest of engine-advisor knows about one serving engine: the ``Engine`` record.

Every field is a fact of the engine's own documentation or of its real start-up logs; each engine
module (``engine_advisor.model.engines.vllm``, ``engine_advisor.model.engines.sglang``) fills one
in, and ``engine_advisor.model.engines`` registers it. Nothing here depends on the rest of ``model``
but the codes of the memory knobs the compiled formulas propose
(``engine_advisor.model.formulas.memory.KNOB_*``). How an engine lays out a hybrid model's state
and KV is a function of plain numbers (``HybridShape`` -> ``StateLayout``), so that the engine
modules need no model code either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field

from engine_advisor.model.formulas.memory import KNOB_NO_PREFIX, KNOB_RUNNING, KNOB_SLOTS

GIB = 2 ** 30
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2,
               "auto": 2}
# How an engine holds a hybrid's linear-attention state beside its KV cache (StateLayout.mode)
NO_STATE, PAGED, SPLIT = 0, 1, 2


@dataclass(frozen=True)
class HybridShape:
    """What an engine's memory planner reads of a served model with linear-attention layers,
    or with sliding-window layers beside full-attention ones, per GPU at its TP size (plain
    numbers: the engine modules import nothing of the model)."""

    n_full: int                      # full-attention layers (their KV grows with the context)
    n_linear: int                    # linear-attention (KDA, GDN, Mamba2) layers
    linear_kind: str                 # "kda" | "gdn" | "mamba2" ("" without linear layers)
    attention: str                   # "mla" | "gqa" | "mha"
    attn_token_layer_bytes: float    # KV bytes of one token in one full-attention layer
    conv_elems: float                # short-convolution state elements of one layer
    ssm_elems: float                 # recurrent state elements of one layer
    ssm_dtype: str | None            # the config.json's ``mamba_ssm_dtype`` (SGLang reads it)
    ssm_cache_dtype: str | None      # its ``mamba_ssm_cache_dtype`` (vLLM reads Nemotron-H's)
    gpu_family: str                  # "hopper" | "blackwell" | ...
    gpu_memory_gib: float
    max_model_len: int               # the context length the engine is launched for
    # sliding-window layers (a token of one costs ``attn_token_layer_bytes``) and their window
    # in tokens; engines pool them apart from the full-attention KV only without linear layers
    n_window: int = 0
    window: int = 0

    @property
    def window_pool(self) -> bool:
        """Full-attention and sliding-window layers and no linear ones: the engines' pools for
        windows (vLLM's sliding-window page groups, SGLang's SWA pool), not state."""
        return self.n_linear == 0 and self.n_window > 0 and self.n_full > 0 and self.window > 0


@dataclass(frozen=True)
class MoeShape:
    """What an engine's fused-MoE kernel selection reads of a served model's routed experts on
    one GPU type at one TP size (plain numbers, as ``HybridShape``)."""

    n_experts: int                   # routed experts per MoE layer
    n_shared: int                    # shared experts (an engine may fuse them in as routed)
    intermediate: int                # one expert's intermediate size per TP rank
    expert_dtype: str                # the checkpoint's expert weights: "bf16", "fp8 block 128x128"
    gpu: str                         # GPU type name ("H200")
    gpu_family: str                  # "hopper" | "blackwell" | ...


class MoeKernel(NamedTuple):
    """An engine's fused-MoE prefill kernel for one served model on one GPU: its time over the
    engine's reference kernel for the same physics (the prior of ``pf_moe``, a tuned bf16
    kernel) and why (empty when it is the reference)."""

    factor: float = 1.0
    note: str = ""


REFERENCE_MOE = MoeKernel()


class MemoryKnobs(NamedTuple):
    """An engine's memory knobs as launched (0 / False: the engine's default): the most
    requests running at once (vLLM ``--max-num-seqs``, SGLang ``--max-running-requests``),
    SGLang's state slots (``--max-mamba-cache-size``), its prefix cache off
    (``--disable-radix-cache``: one state slot per request instead of five) and its
    state-to-KV memory ratio (``--mamba-full-memory-ratio``)."""

    max_running: int = 0
    state_slots: int = 0
    no_prefix_cache: bool = False
    state_ratio: float = 0.0


DEFAULT_KNOBS = MemoryKnobs()


class DecodeKernels(NamedTuple):
    """The kernels an engine launches in one decode step, per part of the served model: what
    its CUDA graph replays, one launch at a time (``engine_advisor.model.physics.launches``
    counts a model's parts). Counted from the engine's decode-step profiles
    (``bench/real_engines/kernel_profile.py --decode``, memory sets and copies left out). A MoE
    layer's fused-MoE call (sorting the tokens by expert, the two grouped GEMMs, the activation,
    the weighted sum) is not counted here: its floor is ``moe_fixed``'s. The defaults are vLLM
    0.26.0's on an H200."""

    sublayer: float = 1.0        # per mixer and per feed-forward: its fused residual add and norm
    attention: float = 8.0       # per GQA / MHA layer, full or windowed: QKV projection, RoPE
    #                              (and QK norm), the cache write, attention, the split-KV
    #                              combine, output projection, their split-K reductions
    mla: float = 14.0            # per MLA layer: query and latent projections, the latent's
    #                              norm, RoPE, the absorbed up-projections, the cache write,
    #                              attention and its combine, output projection
    delta_rule: float = 10.0     # per Gated DeltaNet / KDA layer: input projections and their
    #                              split, the short convolution's update, gating, the recurrent
    #                              update, gated norm, output projection. Counted on Gated
    #                              DeltaNet; vLLM's KDA layer runs nine projections and three
    #                              convolution updates (about 20 kernels), not profiled yet: at
    #                              20, the seed's published vLLM Kimi-K3 time at 64K would be
    #                              5.5 % off at the per-kernel floor, at 10 it is within 5 %
    mamba2: float = 9.0          # per Mamba2 layer: input projection, convolution update, the
    #                              selective-state update, gated norm, output projection
    dense_mlp: float = 4.0       # per dense feed-forward: gate-up GEMM (and its split-K
    #                              reduction), activation, down GEMM
    moe: float = 3.0             # per MoE layer, outside its fused-MoE call: router GEMM,
    #                              top-k, the output's zeroing
    shared_expert: float = 6.0   # per MoE layer with shared experts: their two GEMMs (with
    #                              split-K reductions), activation, the sum with the routed ones
    fp8_gemm: float = 1.0        # per GEMM on block-scaled FP8 weights: quantising its input
    step: float = 20.0           # per step: embedding, final norm, LM head, sampling, metadata
    # not counted in the step's kernels (``moe_fixed`` prices the call): the fused-MoE call's
    # own kernels per MoE layer, what a profile shows beside the others
    moe_call: float = 4.0        # the two grouped GEMMs, the activation, the weighted sum


@lru_cache(maxsize=1024)
def knobs_of(knob: int, running: int, slots: int) -> MemoryKnobs:
    """The memory knobs of a planner's proposal: its code
    (``engine_advisor.model.formulas.memory.KNOB_*``), running limit and state slots."""
    if knob == KNOB_SLOTS:
        return MemoryKnobs(max_running=running, state_slots=slots)
    if knob == KNOB_NO_PREFIX:
        return MemoryKnobs(max_running=running, no_prefix_cache=True)
    if knob == KNOB_RUNNING:
        return MemoryKnobs(max_running=running)
    return DEFAULT_KNOBS


@dataclass(frozen=True)
class StateLayout:
    """How an engine allocates a hybrid model's state and KV on one GPU (``mode``):

    - ``PAGED`` (vLLM): one pool of equal pages. A running request holds ``attn_units`` x
      ceil(tokens / (``block_tokens`` x DCP)) pages of KV and ``state_units`` pages of state;
      a pool block of every layer of a group is ``unit_bytes``.
    - ``SPLIT`` (SGLang): a state pool of ``unit_bytes`` per slot, ``ratio`` : 1 of the memory
      against the KV pool, and at most slots // ``state_units`` running requests.

    ``state_bytes``: one request's state at the engine's dtypes (what a decode step reads and
    writes); ``default_running``: the engine's running-request limit when not set (0: from
    its KV pool); ``graph_bytes``: memory per GPU the engine's budget sets aside for its CUDA
    graphs with this layout; ``notes``: what its start-up log says about the layout."""

    mode: int
    state_bytes: float
    unit_bytes: float
    block_tokens: float = 1.0
    state_units: float = 1.0
    attn_units: float = 1.0
    ratio: float = 0.0
    default_running: float = 0.0
    graph_bytes: float = 0.0     # CUDA graphs' memory the engine profiles and sets aside
    notes: tuple[str, ...] = ()
    windows: bool = False        # the "state" is sliding windows' KV (``HybridShape.window_pool``)
    report_units: float = 0.0    # fixed units a request counts in the reported capacity (0: same)


class PrefixReuse(BaseModel):
    kind: str
    block_tokens: int = Field(ge=1, description="granularity of cache hits: a cached prefix "
                              "counts in whole blocks of this many tokens")


class Incompatibility(BaseModel):
    when: list[str] = Field(min_length=2)
    reason: str


class EngineCapabilities(BaseModel):
    """What an engine supports, as its documentation lists it; anything absent is unsupported
    (``engine_advisor.model.predict.capabilities`` turns a workload's requirements into exclusions
    with it)."""

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
    # hybrids: how the engine holds linear-attention state beside KV (its memory planner), the
    # running-request limit it starts with on a GPU of so many GiB, and the flags of its
    # memory knobs (MemoryKnobs: "max_running", "state_slots", "no_prefix_cache")
    state_layout: Callable[[HybridShape], StateLayout] | None = None
    default_running: Callable[[float], int] = lambda gib: 256
    knob_flags: tuple[tuple[str, str], ...] = ()
    # what the engine's own kernels of a family take over their term's physics, measured by
    # profiling its prefill kernel by kernel (bench/real_engines/kernel_profile.py): the prior
    # of that term's coefficient in every fit of the engine, where the others start at 1.
    # Only terms no dense model has (the linear-attention families) are set this way, so that
    # a hybrid's own kernels, not its neighbours' end-to-end times, say what it costs
    kernel_priors: tuple[tuple[str, float], ...] = ()
    # the same for kernels the engine runs on one GPU family only: (family, its (term,
    # coefficient) pairs), over ``kernel_priors`` in that family's fits
    family_priors: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()
    # the engine's fused-MoE prefill kernel for a model's experts (``MoeKernel``): where its
    # kernel for those experts runs slower than the one its ``pf_moe`` prior was measured on
    # (an untuned kernel configuration, block-scaled FP8); None: always the reference
    moe_kernel: Callable[[MoeShape], MoeKernel] | None = None
    # the kernels one decode step launches per part of a model (``DecodeKernels``): what the
    # decode step's fixed cost counts (``kernel_fixed``)
    decode_kernels: DecodeKernels = DecodeKernels()
    # engines whose memory flag is not a fraction of the whole GPU (TensorRT-LLM's is one of
    # the memory free after weights and activations): the flag's value for a fraction of the
    # whole GPU, from (fraction, GPU memory bytes, bytes per GPU in use before the KV cache);
    # None: the flag takes the fraction itself
    flag_fraction: Callable[[float, float, float], float] | None = None
    # engines with a configuration file beside the command line: its flag, the path the
    # command names, and its content (a dict written as YAML) from (DCP size, the memory
    # flag's value, KV dtype); "" / None: none
    config_flag: str = ""
    config_path: str = ""
    config_file: Callable[[int, float, str], dict] | None = None
    # engines whose DCP ranks are GPUs of their own beside TP (TensorRT-LLM's context
    # parallelism: world = tp x cp): the parallel flags for ``num_gpus`` GPUs at DCP ``dcp``;
    # None: ``tp_flag num_gpus`` and ``dcp_flag dcp`` within the TP group
    parallel_args: Callable[[int, int], list[str]] | None = None
    # GPU families (``engine_advisor.model.hardware.gpus.gpu_family``) DCP > 1 runs on (empty:
    # any) and what a recommendation of DCP > 1 must say about it ("": nothing)
    dcp_gpu_families: frozenset[str] = frozenset()
    dcp_note: str = ""
    # why the engine's predictions cannot be calibrated yet ("": they can, with
    # ``engine-advisor calibrate run``)
    uncalibrated_note: str = ""
    # whether a workload naming no engines considers it: an engine known only by its priors
    # (TensorRT-LLM) is ranked where a workload names it, so that its priors never displace the
    # answers measured engines gave before it was added
    default_candidate: bool = True

    def flag_value(self, fraction: float, memory: float = 0.0, used: float = 0.0) -> float:
        """The memory flag's value for ``fraction`` of the whole GPU: the fraction itself,
        or the engine's own (``flag_fraction``) given the GPU's memory and the bytes per GPU in
        use before the KV cache (weights, reserve, activations)."""
        if self.flag_fraction is None or memory <= 0:
            return fraction
        return self.flag_fraction(fraction, memory, used)

    def launch_command(self, model: str, tp: int, dcp: int, fraction: float,
                       memory_flags: Sequence[str] = (), kv_dtype: str = "bf16") -> list[str]:
        """The engine's command line for one instance: TP ``tp``, DCP ``dcp`` (flag only when
        > 1), memory fraction to two decimals (the flag's value: ``flag_value``), the flags of
        its memory knobs (``knob_args``), a KV cache dtype other than the default and the
        engine's configuration file (``config_flag``)."""
        cmd = [*self.program, *((self.model_flag,) if self.model_flag else ()), model]
        if self.parallel_args is not None:
            cmd += self.parallel_args(tp, dcp)
        else:
            cmd += [self.tp_flag, str(tp)]
            if dcp > 1:
                cmd += [self.dcp_flag, str(dcp)]
        cmd += [self.mem_flag, f"{fraction:.2f}", *memory_flags]
        if kv_dtype in self.kv_dtype_values:
            cmd += [self.kv_dtype_flag, self.kv_dtype_values[kv_dtype]]
        if self.config_flag:
            cmd += [self.config_flag, self.config_path]
        return cmd

    def config_text(self, dcp: int, fraction: float, kv_dtype: str = "bf16") -> str | None:
        """The engine's configuration file for one instance as YAML text (None without
        one): DCP ``dcp``, the memory flag's value ``fraction``, KV dtype ``kv_dtype``."""
        if self.config_file is None:
            return None
        return yaml.safe_dump(self.config_file(dcp, fraction, kv_dtype), sort_keys=False)

    def knob_args(self, knobs: MemoryKnobs) -> list[str]:
        """The flags of the knobs set (``knob_flags``; the running-request limit is
        ``max_running_flag``)."""
        flags = dict(self.knob_flags)
        out: list[str] = []
        if knobs.no_prefix_cache and "no_prefix_cache" in flags:
            out.append(flags["no_prefix_cache"])
        if knobs.state_slots and "state_slots" in flags:
            out += [flags["state_slots"], str(knobs.state_slots)]
        if knobs.state_ratio and "state_ratio" in flags:
            out += [flags["state_ratio"], f"{knobs.state_ratio:g}"]
        if knobs.max_running:
            out += [self.max_running_flag, str(knobs.max_running)]
        return out

    def reserve(self, activation_bytes: float = 0.0) -> float:
        """Bytes per GPU the memory fraction spends outside weights and KV: the engine's
        reserve, plus the activation peak when its budget holds it."""
        return self.reserve_bytes + (activation_bytes if self.counts_activations else 0.0)

    def graphed_prefill_tokens(self, attention: str) -> int:
        """The largest prefill pass (tokens) the engine replays as a captured CUDA graph for
        a model with this attention (``ModelShape.attention``); 0 when it launches every pass
        kernel by kernel. A graphed pass pays no launch-bound fixed costs
        (``engine_advisor.model.formulas.terms.prefill_into``)."""
        return self.prefill_graph_tokens if attention in self.prefill_graph_attention else 0

    def dcp_constraint(self, dcp: int, tp: int, attention: str, kv_heads: int,
                       gpu_family: str = "") -> str | None:
        """Why DCP ``dcp`` cannot run with TP ``tp`` on a model with this attention
        (``ModelShape.attention``: mla, gqa, mha, unknown) and KV heads, or None. DCP stripes
        a TP group's KV over ``dcp`` ranks, so ``dcp`` divides ``tp``; GQA/MHA KV heads
        replicated over the TP group must be replicated a multiple of ``dcp`` times; an engine
        with ``dcp_gpu_families`` runs DCP > 1 on those GPU families (``gpu_family``) only, and
        one whose DCP is experimental (``dcp_note``) not on a model of unknown attention."""
        if tp % dcp:
            return f"dcp {dcp} does not divide the tensor-parallel size {tp}"
        if dcp == 1:
            return None
        if attention == "unknown" and self.dcp_note:
            return (f"{self.label}'s DCP > 1 runs on {', '.join(sorted(self.dcp_attention))} "
                    "attention only, and this model's attention is unknown (only its KV bytes "
                    "per token are given)")
        if attention == "mla" and "mla" not in self.dcp_attention:
            return f"{self.label} implements DCP for GQA/MHA attention only; this model uses MLA"
        if attention in ("gqa", "mha"):
            if attention not in self.dcp_attention:
                return (f"{self.label} implements DCP for MLA attention only; this model uses "
                        "GQA")
            replicas = tp // kv_heads if kv_heads and kv_heads < tp else 1
            if replicas % dcp:
                return (f"{self.label} needs (tp // kv_heads) % dcp == 0: KV heads {kv_heads} "
                        f"on tp {tp} are replicated {replicas}x, so dcp {dcp} cannot stripe "
                        "them")
        if self.dcp_gpu_families and gpu_family not in self.dcp_gpu_families:
            return (f"{self.label} runs DCP > 1 on {', '.join(sorted(self.dcp_gpu_families))} "
                    f"GPUs only; this GPU is {gpu_family or 'of an unknown family'}")
        return None
