"""vLLM (``vllm serve``), from its documentation and a real 0.26.0 on one H200.

Memory: ``--gpu-memory-utilization`` budgets the whole instance. "Actual usage is 29.34 GiB for
weight, 1.09 GiB for peak activation, 0.23 GiB for non-torch memory, and 1.2 GiB for CUDAGraph
memory" (deepseek-v2-lite; llama-3.1-8b: 1.1 and 0.22 GiB): the KV budget is fraction x memory
- weights - peak activation - non-torch ("Available KV cache memory: 95.16 GiB" = 0.9 x 139.8 -
29.34 - 1.09 - 0.23). The CUDA graphs are captured afterwards, outside it (hence OOM near 0.95). The
activation peak is the model's (``engine_advisor.model.physics.memory.activation_peak_bytes``); the
non-torch memory is the reserve. NCCL buffers at TP > 1 are not counted.

Prefill CUDA graphs: 0.26.0 captures piecewise graphs of mixed prefill-decode batches of up to
512 tokens (``cudagraph_capture_sizes`` 1 ... 512, ``max_cudagraph_capture_size`` 512, mode
FULL_AND_PIECEWISE); larger passes run the compiled model kernel by kernel.

DCP (``--decode-context-parallel-size``): tp % dcp == 0, and on GQA models
(tp // kv_heads) % dcp == 0. Capabilities as the architecture comparison of vLLM and SGLang
summarises the official documentation.

Hybrids (``state_layout``; vLLM 0.26.0's ``platforms/interface.py``, ``v1/core/
kv_cache_utils.py``, ``model_executor/layers/mamba/mamba_utils.py``, ``models/config.py``):
attention KV and linear-attention state share one pool of equal pages. The attention block is
raised to ``align x ceil(S / (align x a))`` tokens (S: one layer's state, a: one token of one
attention layer; ``align`` the attention kernel's block, 16 for FLASH_ATTN / FLASH_ATTN_MLA on
Hopper, 32 for FlashInfer MLA on Blackwell) and the state page padded to it ("Setting attention
block size to 1888 tokens"). Layers are grouped ``G = min(attention, linear)`` to a group (the
larger count when it is under 1.5x the smaller; "Add 1 padding layers"); ``num_blocks =
available // page // G``; a running request takes ceil(tokens / block) blocks per attention
group and one per state group (prefix caching is off for hybrids by default). The state is
the model dtype (GDN), float32 (KDA) or Nemotron-H's ``mamba_ssm_cache_dtype`` (Mamba2). The
logged "GPU KV cache size" is ``num_blocks / blocks of one max_model_len request x
max_model_len``. The real H200 logs: Nemotron-3-Nano 2,096-token blocks, 10,951,569 tokens
(65.14 GiB); Qwen3-Next-80B-A3B 544-token blocks, 2,114,448 tokens (48.72 GiB). ``max_num_seqs``
defaults to 1024 on GPUs of 70 GiB and more (256 below), and the profiled activation peak
holds its sampler rows. For these hybrids it also profiles its CUDA graphs' memory and takes it
out of the KV budget ("CUDA graph memory profiling is enabled ... equivalent to
--gpu-memory-utilization=0.8957"): 0.43 GiB (Nemotron-3-Nano) and 0.60 GiB (Qwen3-Next) at
``--max-num-seqs 128`` on the H200, ``HYBRID_GRAPH_BYTES``.

Sliding-window layers beside full-attention ones (no linear layers: ``window_layout``; the
hybrid KV cache manager of ``v1/core/kv_cache_utils.py`` and ``SlidingWindowSpec``): the same
pool of equal pages in groups of layers of one kind, a window group's request holding only the
pages of its window and the chunk being prefilled. DCP is not taken for such models.

Fused MoE on Hopper (``moe_kernel``): vLLM's Triton fused-MoE kernel takes bf16 experts at
1.21-1.72 x their physics on an H200 whether its configuration is tuned or its default
(DeepSeek-V2-Lite 1.32-1.36 x, Mixtral-8x7B 1.21-1.24 x): the fit carries that with ``pf_moe`` at
1 and the fixed costs. Block-FP8 experts run its Triton w8a8 block kernel: on the same expert
shapes it takes 1.25-1.82 x the bf16 kernel's time for the same physics, median 1.5
(aiconfigurator-core 0.12.0's vLLM 0.24.0 H200 tables at 8,192 tokens, seven shapes). Qwen3-Next's
experts took 2.98-3.41 x their FP8 physics in our profile, 2.2-2.5 x other models' bf16 kernels
(another shape); with 2.4 the fit of vLLM's rows with Qwen3-Next's frees no term at all.
"""

import math

from engine_advisor.model.engines.base import (
    DTYPE_BYTES,
    GIB,
    PAGED,
    DecodeKernels,
    Engine,
    EngineCapabilities,
    HybridShape,
    Incompatibility,
    Metrics,
    MoeKernel,
    MoeShape,
    PrefixReuse,
    StateLayout,
)

HYBRID_GRAPH_BYTES = 0.5 * GIB
BLOCK_FP8_MOE = 1.5          # block-FP8 experts over bf16 ones, same physics (module docstring)
MAX_BATCHED_TOKENS = 8192    # vllm serve's max_num_batched_tokens: a chunk of prefill


def moe_kernel(m: MoeShape) -> MoeKernel:
    """vLLM's fused-MoE kernel for ``m``'s experts on a Hopper GPU (module docstring)."""
    if m.gpu_family == "hopper" and m.n_experts > 0 and m.expert_dtype.startswith("fp8 block"):
        return MoeKernel(BLOCK_FP8_MOE, "vLLM runs block-FP8 experts on its Triton w8a8 block "
                         f"kernel, measured at {BLOCK_FP8_MOE:g} x its bf16 kernel's time for "
                         "the same physics")
    return MoeKernel()

def kernel_block(gpu_family: str, attention: str) -> int:
    """The attention kernel's block alignment (tokens): FLASH_ATTN and FLASH_ATTN_MLA (Hopper)
    take multiples of 16; Blackwell's default MLA backend, FlashInfer MLA, 32 or 64."""
    return 32 if gpu_family == "blackwell" and attention == "mla" else 16


def default_running(gpu_gib: float) -> int:
    """``max_num_seqs`` of ``vllm serve``: 1024 on GPUs of 70 GiB and more, else 256."""
    return 1024 if gpu_gib >= 70 else 256


def group_size(a: int, b: int) -> int:
    """Layers per KV cache group of a model with ``a`` layers of one kind and ``b`` of
    another: the smaller count, or the larger where it is under 1.5 x the smaller (fewer
    padding layers)."""
    lo, hi = sorted((a, b))
    return hi if hi < 1.5 * lo else lo


def padding_notes(group: int, *counts: int) -> list[str]:
    """The start-up warning per kind whose layers do not fill whole groups."""
    notes = []
    for n in counts:
        pad = -n % group
        if n and pad:
            notes.append(f"Add {pad} padding layers, may waste at most {pad / n * 100:.2f}% KV "
                         "cache memory")
    return notes


def window_layout(h: HybridShape) -> StateLayout:
    """Full-attention and sliding-window layers: groups of ``group_size`` layers of one kind
    share one pool of equal pages (one layer's block of tokens each). A running request holds
    ceil(tokens / block) pages per full-attention group and, per window group, the pages of its
    last ``window - 1`` tokens plus one (the window need not start a page); the pages behind
    the window are freed as it slides. The capacity vLLM logs counts a window group's pages
    of ``window - 1 + MAX_BATCHED_TOKENS`` tokens plus one (``SlidingWindowSpec``'s
    admission bound: a whole prefill chunk past the window)."""
    block = kernel_block(h.gpu_family, h.attention)
    group = group_size(h.n_full, h.n_window)
    span = h.window - 1 + MAX_BATCHED_TOKENS
    if h.max_model_len:
        span = min(span, h.max_model_len)
    groups = math.ceil(h.n_window / group)
    return StateLayout(PAGED, state_bytes=0.0, unit_bytes=block * h.attn_token_layer_bytes
                       * group, block_tokens=block,
                       state_units=groups * (math.ceil((h.window - 1) / block) + 1),
                       report_units=groups * (math.ceil(span / block) + 1),
                       attn_units=math.ceil(h.n_full / group),
                       default_running=default_running(h.gpu_memory_gib),
                       notes=tuple(padding_notes(group, h.n_full, h.n_window)), windows=True)


def state_layout(h: HybridShape) -> StateLayout:
    """vLLM's unified page pool for a hybrid (module docstring)."""
    if h.window_pool:
        return window_layout(h)
    if h.linear_kind == "kda":
        ssm = 4                                   # float32, hard-coded
    elif h.linear_kind == "mamba2":
        ssm = DTYPE_BYTES.get(h.ssm_cache_dtype or "float32", 4)
    else:
        ssm = 2                                   # "auto": the model dtype
    layer = h.conv_elems * 2 + h.ssm_elems * ssm
    a = h.attn_token_layer_bytes
    notes = []
    if h.n_full and a > 0:
        align = kernel_block(h.gpu_family, h.attention)
        block = align * math.ceil(layer / (align * a))
        page = block * a
        group = group_size(h.n_full, h.n_linear)
        notes.append(f"Setting attention block size to {block} tokens to ensure that "
                     "attention page size is >= mamba page size.")
        if page != layer:
            notes.append(f"Padding mamba page size by {(page - layer) / layer * 100:.2f}% to "
                         "ensure that mamba page size and attention page size are exactly "
                         "equal.")
    else:
        block, page, group = 1, layer, max(h.n_linear, 1)
    notes += padding_notes(group, h.n_full, h.n_linear)
    return StateLayout(PAGED, state_bytes=h.n_linear * layer, unit_bytes=page * group,
                       block_tokens=block, state_units=math.ceil(h.n_linear / group),
                       attn_units=math.ceil(h.n_full / group),
                       default_running=default_running(h.gpu_memory_gib),
                       graph_bytes=HYBRID_GRAPH_BYTES, notes=tuple(notes))

ENGINE = Engine(
    name="vllm",
    label="vLLM",
    program=("vllm", "serve"),
    model_flag=None,
    tp_flag="--tensor-parallel-size",
    dcp_flag="--decode-context-parallel-size",
    max_running_flag="--max-num-seqs",
    kv_dtype_flag="--kv-cache-dtype",
    kv_dtype_values={"fp8": "fp8"},
    mem_flag="--gpu-memory-utilization",
    mem_covers="the whole instance: weights, activations, non-torch memory and KV (CUDA "
               "graphs are captured after, outside it)",
    reserve_bytes=0.23 * GIB,
    counts_activations=True,
    dcp_attention=frozenset({"mla", "gqa", "mha"}),
    prefill_graph_tokens=512,
    prefill_graph_attention=frozenset({"mla", "gqa", "mha"}),
    capabilities=EngineCapabilities(
        hardware_vendors=["nvidia", "amd", "tpu", "cpu"],
        quantization=["fp8", "awq", "gptq", "gptq_marlin", "int8", "mxfp4", "bitsandbytes",
                      "gguf", "torchao", "nvfp4", "compressed_tensors", "quark", "inc",
                      "w8a8_fp8", "w8a8_int8", "int4"],
        speculative_methods=["draft_model", "eagle", "mtp", "ngram"],
        lora=True,
        pipeline_parallel=True,
        dp_attention=False,
        prefix_reuse=PrefixReuse(
            kind="automatic prefix caching: hash-based, block-granular, exact prefix, on by "
                 "default",
            block_tokens=16),
        incompatible=[Incompatibility(
            when=["pipeline_parallel", "speculative_method"],
            reason="vLLM does not support pipeline parallelism together with speculative "
                   "decoding (documented for vLLM <= 0.15.0)")]),
    metrics=Metrics(
        running="vllm:num_requests_running",
        waiting="vllm:num_requests_waiting",
        kv_usage="vllm:kv_cache_usage_perc",
        ttft="vllm:time_to_first_token_seconds",
        inter_token="vllm:inter_token_latency_seconds",
        e2e="vllm:e2e_request_latency_seconds",
        prompt_tokens="vllm:prompt_tokens_total",
        generation_tokens="vllm:generation_tokens_total",
        prefixes=("vllm:",)),
    info_paths=("/version",),
    image="vllm/vllm-openai",
    port=8000,
    state_layout=state_layout,
    default_running=default_running,
    # vLLM 0.26.0 on an H200 (docs/validation.md, "Where the prefill time goes"): its Triton
    # Gated DeltaNet kernels 4.68-4.86 x the delta rule's physics, its Mamba2 SSD kernels and
    # conv1d 4.37-4.58 x theirs, at 1 x 16,384 and 16 x 1,024 prompt tokens
    kernel_priors=(("pf_linear", 4.8), ("pf_ssd", 4.5)),
    moe_kernel=moe_kernel,
    # the kernels one decode step launches per part of a model: counted in vLLM 0.26.0's decode
    # steps on an H200 (Llama-3.1-8B 440, Qwen3-30B-A3B 886, DeepSeek-V2-Lite 795,
    # Nemotron-3-Nano 634 a step; the table 468, 836, 794, 626: docs/validation.md, "Decode
    # steps"); the defaults are these counts
    decode_kernels=DecodeKernels(),
)
