"""SGLang (``python -m sglang.launch_server``), from its documentation and a real 0.5.16 on one
H200.

Memory: ``--mem-fraction-static`` covers weights + the KV pool; activations and CUDA graphs
come out of the rest. Its pool is fraction x memory - weights - what the process held before
loading them (CUDA context and allocator: "avail mem=139.09 GB" of 139.8 at start, 0.71 GiB):
that is the reserve. NCCL buffers at TP > 1 are not counted.

Prefill CUDA graphs: 0.5.16 captures prefill passes of up to 8,192 tokens ("Capture target
prefill CUDA graph ... backend=breakable, num_tokens=[4, ..., 8192]"; its prefill batches log
"cuda graph: True"), except for MLA models ("Breakable CUDA graph is incompatible with MLA
attention; disabling prefill CUDA graph"). On the H200, Qwen3-30B-A3B's 1,024-token prompt
reached its first token in 33 ms where vLLM, launching that pass kernel by kernel, took 98 ms.

DCP (``--dcp-size``): the TP group divisible by dcp, MLA attention only. Capabilities as the
architecture comparison of vLLM and SGLang summarises the official documentation.

Hybrids (``state_layout``; SGLang 0.5.16's ``mem_cache/kv_cache_configurator.py``,
``configs/mamba_utils.py``): the memory left after weights under ``--mem-fraction-static``
(``rest``) is split into a state pool and a KV pool. The state pool takes ``rest x r / (1 +
r)`` (``--mamba-full-memory-ratio`` r, default 0.9) in slots of one request's state (float32
recurrent state unless the config's ``mamba_ssm_dtype`` says otherwise, bf16 convolution
window): "Mamba Cache is allocated. max_mamba_cache_size: 329"; ``--max-mamba-cache-size N``
sets the slots instead, and ``--disable-radix-cache --max-running-requests R`` sets R. The KV
pool takes the rest, counting only full-attention layers ("#tokens: 1154717"). At most
slots // 5 requests run (three slots each for the radix cache, two ping-pong slots for the
overlap scheduler; one with the radix cache off): "max_running_requests was reduced from the
requested 128 to ..." (the real H200 log of Qwen3-Next-80B-A3B: 329 slots, 65 running). DCP
multiplies the KV tokens, not the state.

Sliding-window layers beside full-attention ones (no linear layers: ``window_layout``;
``model_runner_kv_cache_mixin.py``'s ``set_num_tokens_hybrid_swa``): the memory after weights
is counted in tokens of every attention layer, then split so that the SWA pool holds
``--swa-full-tokens-ratio`` (default 0.8) tokens for each token of the full pool: full tokens =
rest / (full layers + 0.8 x window layers) / one layer's KV per token ("Use sliding window
memory pool. full_layer_tokens=..., swa_layer_tokens=..."; ``#tokens`` is the full pool). A
running request keeps at most its window in the SWA pool (the tokens behind it are freed), so
the SWA pool admits about swa tokens / window requests at once.

Fused MoE on Hopper (``moe_kernel``): SGLang runs routed experts on its Triton fused-MoE kernel
with a configuration looked up by file name (experts, intermediate size per TP rank, GPU, dtype;
``model/data/sglang_moe_configs.json`` lists what 0.5.16 ships, written by
``bench/real_engines/moe_configs.py``). Its kernels' prefill on an H200
(docs/validation.md, "Where the prefill time goes"), over the physics:

- bf16 with a shipped configuration: Mixtral-8x7B 1.22-1.28 x, Qwen3-30B-A3B 1.65-1.79 x
  (aiconfigurator-core 0.12.0's SGLang 0.5.14 tables: 1.23 and 1.37 x on the same shapes at
  8,192 tokens): the ``pf_moe`` prior, 1.5;
- bf16 without one ("Using default MoE kernel config"): DeepSeek-V2-Lite 2.61-2.76 x,
  Nemotron-3-Nano 2.41-2.42 x: 1.7 x the tuned kernel;
- block-FP8 experts (its Triton w8a8 block kernel): Qwen3-Next 2.48-2.92 x the FP8 physics,
  with a shipped configuration: 1.8 x.

With the kernel at its measured multiple, the fixed cost per fused-MoE call left for
``pf_moe_fixed`` is 0.6 ms (what SGLang's rows free it at; 2.4 ms while the kernel was priced
at the physics).
"""

import json
from functools import lru_cache
from pathlib import Path

from engine_advisor.model.engines.base import (
    DTYPE_BYTES,
    GIB,
    SPLIT,
    DecodeKernels,
    Engine,
    EngineCapabilities,
    HybridShape,
    Metrics,
    MoeKernel,
    MoeShape,
    PrefixReuse,
    StateLayout,
)

STATE_RATIO = 0.9        # --mamba-full-memory-ratio's default: state pool : KV pool
SLOTS_PER_REQUEST = 5    # radix cache (3) and overlap scheduling's ping-pong slots (2)
DEFAULT_RUNNING = 2048   # the least max_running_requests SGLang starts with when not given
SWA_RATIO = 0.8          # --swa-full-tokens-ratio's default: SWA pool tokens : full pool tokens
MOE_CONFIGS = Path(__file__).resolve().parent.parent / "data" / "sglang_moe_configs.json"
# the device names SGLang's configuration files carry, per GPU type (torch's device name)
DEVICE_NAMES = {"H100": "NVIDIA_H100_80GB_HBM3", "H200": "NVIDIA_H200", "H20": "NVIDIA_H20",
                "H800": "NVIDIA_H800"}
UNTUNED_MOE = 1.7        # bf16 experts at the default configuration, over a tuned one
BLOCK_FP8_MOE = 1.8      # block-FP8 experts (Triton w8a8 block kernel), over tuned bf16


@lru_cache(maxsize=1)
def _shipped() -> dict[str, frozenset[str]]:
    doc = json.loads(MOE_CONFIGS.read_text())
    return {device: frozenset(keys) for device, keys in doc["configs"].items()}


def moe_kernel(m: MoeShape) -> MoeKernel:
    """SGLang's Triton fused-MoE kernel for ``m``'s experts on a Hopper GPU (module docstring);
    other families run other kernels (the reference)."""
    if m.gpu_family != "hopper" or m.n_experts <= 0:
        return MoeKernel()
    if m.expert_dtype.startswith("fp8 block"):
        return MoeKernel(BLOCK_FP8_MOE, "SGLang runs block-FP8 experts on its Triton w8a8 block "
                         f"kernel, measured at {BLOCK_FP8_MOE:g} x its tuned bf16 kernel's time "
                         "for the same physics")
    if m.expert_dtype not in ("bf16", "fp16"):
        return MoeKernel()
    device = DEVICE_NAMES.get(m.gpu, f"NVIDIA_{m.gpu}")
    shipped = _shipped().get(device, frozenset())
    if any(f"{e},{m.intermediate},bf16" in shipped for e in (m.n_experts,
                                                            m.n_experts + m.n_shared)):
        return MoeKernel()
    return MoeKernel(UNTUNED_MOE, f"SGLang 0.5.16 ships no tuned fused-MoE configuration for "
                     f"{m.n_experts} experts of intermediate size {m.intermediate} on "
                     f"{m.gpu} (E={m.n_experts},N={m.intermediate}): its Triton kernel runs a "
                     f"default one, measured at {UNTUNED_MOE:g} x a tuned kernel's time "
                     "(a configuration tuned for this shape with SGLang's fused-MoE tuning script "
                     "removes it)")


def window_layout(h: HybridShape) -> StateLayout:
    """SGLang's SWA pool beside the full-attention KV pool (module docstring): token pools in
    the memory ratio ``SWA_RATIO x window layers : full layers``, a request holding its window's
    tokens of every sliding-window layer in the SWA pool, one slot a request."""
    per_request = h.window * h.n_window * h.attn_token_layer_bytes
    return StateLayout(SPLIT, state_bytes=0.0, unit_bytes=per_request, state_units=1,
                       ratio=SWA_RATIO * h.n_window / h.n_full, windows=True)


def state_layout(h: HybridShape) -> StateLayout:
    """SGLang's split of state and KV pools for a hybrid (module docstring)."""
    if h.window_pool:
        return window_layout(h)
    ssm = DTYPE_BYTES.get(h.ssm_dtype or "float32", 4)
    per_request = h.n_linear * (h.conv_elems * 2 + h.ssm_elems * ssm)
    return StateLayout(SPLIT, state_bytes=per_request, unit_bytes=per_request,
                       state_units=SLOTS_PER_REQUEST, ratio=STATE_RATIO)

ENGINE = Engine(
    name="sglang",
    label="SGLang",
    program=("python", "-m", "sglang.launch_server"),
    model_flag="--model-path",
    tp_flag="--tp",
    dcp_flag="--dcp-size",
    max_running_flag="--max-running-requests",
    kv_dtype_flag="--kv-cache-dtype",
    kv_dtype_values={"fp8": "fp8_e4m3"},
    mem_flag="--mem-fraction-static",
    mem_covers="weights and the KV pool; activations and CUDA graphs live outside it",
    reserve_bytes=0.71 * GIB,
    counts_activations=False,
    dcp_attention=frozenset({"mla"}),
    prefill_graph_tokens=8192,
    prefill_graph_attention=frozenset({"gqa", "mha"}),
    capabilities=EngineCapabilities(
        hardware_vendors=["nvidia", "amd", "ascend"],
        quantization=["fp8", "awq", "gptq", "gptq_marlin", "int8", "mxfp4", "w8a8_fp8",
                      "w8a8_int8", "blockwise_int8", "mxfp8", "compressed_tensors", "quark",
                      "auto_round"],
        speculative_methods=["eagle", "eagle3", "draft_model", "mtp"],
        lora=True,
        pipeline_parallel=True,
        dp_attention=True,
        prefix_reuse=PrefixReuse(kind="RadixAttention: radix tree, token-granular, automatic",
                                 block_tokens=1)),
    metrics=Metrics(
        running="sglang:num_running_reqs",
        waiting="sglang:num_queue_reqs",
        kv_usage="sglang:token_usage",
        ttft="sglang:time_to_first_token_seconds",
        inter_token="sglang:inter_token_latency_seconds",
        e2e="sglang:e2e_request_latency_seconds",
        prompt_tokens="sglang:prompt_tokens_total",
        generation_tokens="sglang:generation_tokens_total",
        prefixes=("sglang:", "sglang_")),
    info_paths=("/get_server_info", "/server_info"),
    image="lmsysorg/sglang",
    port=30000,
    state_layout=state_layout,
    default_running=lambda gib: DEFAULT_RUNNING,
    knob_flags=(("state_slots", "--max-mamba-cache-size"),
                ("no_prefix_cache", "--disable-radix-cache"),
                ("state_ratio", "--mamba-full-memory-ratio")),
    # SGLang 0.5.16 on an H200 (docs/validation.md, "Where the prefill time goes"): its Triton
    # Gated DeltaNet kernels 4.20-4.68 x the delta rule's physics, but its Mamba2 SSD kernels
    # and conv1d 18.8-19.4 x theirs (vLLM's: 4.4-4.6 x), at 1 x 16,384 and 16 x 1,024 tokens
    kernel_priors=(("pf_linear", 4.4), ("pf_ssd", 19.1)),
    # on Hopper its Triton fused MoE at a tuned configuration: 1.5 x its physics, 0.6 ms a
    # call beside (module docstring; ``moe_kernel`` for experts it has no tuned configuration
    # of). Blackwell runs other MoE kernels: the physics priors there
    family_priors=(("hopper", (("pf_moe", 1.5), ("pf_moe_fixed", 0.6e-3))),),
    moe_kernel=moe_kernel,
    # the kernels one decode step launches per part of a model, counted by hand in SGLang
    # 0.5.16's prefill profiles on an H200 (two prefill passes and one decode step each:
    # docs/validation.md, "Decode steps"): its MLA adds its latent buffer's gather and scatter,
    # its fused-MoE call the tokens' alignment and sorting by expert
    decode_kernels=DecodeKernels(attention=7.0, mla=16.0, moe_call=6.0),
)
