"""TensorRT-LLM (``trtllm-serve``), from its source and documentation (NVIDIA/TensorRT-LLM:
``tensorrt_llm/commands/serve.py``, ``tensorrt_llm/serve/openai_server.py``,
``tensorrt_llm/llmapi/llm_args.py``, ``docs/source/features/helix.md``). Never run here: the
PyPI package ``tensorrt-llm`` is a stub pointing at NVIDIA's own index, which these machines
cannot reach, so no start-up log backs the numbers below and every prediction for it is the
physics prior (``uncalibrated_note``).

Command line (``serve.py``): ``trtllm-serve MODEL`` (positional), ``--tp_size``, ``--pp_size``,
``--cp_size`` (context parallelism), ``--ep_size`` (expert parallelism, left at the engine's
default here), ``--max_batch_size`` (most requests scheduled at once; BuildConfig's default
2048), ``--max_num_tokens`` (8192), ``--max_seq_len``, ``--kv_cache_free_gpu_memory_fraction``
and ``--config`` (alias ``--extra_llm_api_options``): a YAML file whose keys override the
LLM API arguments the flags set. Port 8000. The KV cache dtype has no flag: it is
``kv_cache_config.dtype`` in that file.

Memory: ``--kv_cache_free_gpu_memory_fraction`` (default 0.9; ``KvCacheConfig.
free_gpu_memory_fraction``) is the share of the memory still free once the weights are loaded
and a profiling pass has taken its activations and buffers, not a share of the whole GPU as
vLLM's and SGLang's fractions are. The recommender works with a whole-GPU fraction ``f``:
weights, reserve, activations and KV together stay under ``f x memory``. So the KV budget is
``f x M - used``, with ``used`` the bytes per GPU in use before the KV cache (weights / TP,
the reserve, the activation peak), and TensorRT-LLM must be given ``free_fraction(f) =
(f x M - used) / (M - used)``: the same budget by its own rule (``kv_budget``). The rest of the
free memory (``1 - free_fraction``) stays free, as with ``f``. ``KvCacheConfig.
max_gpu_total_bytes`` caps the KV bytes instead (not used here). The reserve (CUDA context,
runtime buffers outside the profiled pass) is a prior of 1 GiB; TensorRT-LLM's start-up log
reports the KV cache it allocated in GiB and tokens, which would replace it.

Prefix reuse: ``KvCacheConfig.enable_block_reuse`` (on by default) reuses whole blocks of
``tokens_per_block`` tokens (default 32). No prefill pass runs as a captured CUDA graph (its
CUDA graphs cover generation batches).

Hybrids: ``KvCacheConfig.mamba_ssm_cache_dtype`` ("auto": the model config's) sets the
recurrent state's dtype; the state is one slot per running request beside the KV blocks, costed
here per running sequence (no pooled layout).

DCP: TensorRT-LLM has none in aggregated serving. Its decode context parallelism is Helix
(``helix.md``): ``context_parallel_size`` >= 2 with ``cp_config.cp_type: HELIX`` and
``cp_config.tokens_per_block`` equal to ``kv_cache_config.tokens_per_block``; the KV cache is
partitioned over the CP ranks, each computes partial attention over its shard and the partial
results are combined, and the CP ranks serve as TP ranks for the FFN/MoE layers. It is for the
generation servers of disaggregated serving (the prefill servers run CP 1), for MLA models on
Blackwell GPUs, it pays off above 64K-token inputs at small batches, and it is a prototype
feature (``cp_config`` is marked prototype). Here it is a DCP size > 1 on MLA models on
Blackwell only, with a reason saying that it is experimental, decode-only and a prior; world
size = tp x cp, so ``num_gpus`` GPUs run ``--tp_size num_gpus / cp --cp_size cp``. The cost
model counts the weights as sharded over all ``num_gpus``; attention weights split only
``tp`` ways under Helix are not counted again (a known gap of the prior).

Capabilities: quantization (``QuantAlgo``: FP8 per tensor / per channel / block scales, NVFP4,
MXFP4 (W4A8 / W4A16), INT4 and INT8 weight-only, AWQ, GPTQ, SmoothQuant W8A8), speculative
decoding (``DecodingConfig``: draft-target, EAGLE, EAGLE-3, Medusa, MTP, n-gram, lookahead),
LoRA (``enable_lora``), pipeline parallelism, attention data parallelism
(``enable_attention_dp``), NVIDIA GPUs only.

Metrics: ``GET /metrics`` answers JSON iteration stats (``kvCacheStats`` among them); the
Prometheus names are served at ``/prometheus/metrics`` when the ``--config`` file sets
``return_perf_metrics: true`` (``trtllm_`` prefix: ``trtllm_num_requests_running``,
``trtllm_num_requests_waiting``, ``trtllm_kv_cache_utilization``, as the Gateway API Inference
Extension reads them for its ``trtllm-serve`` engine type, and the latency histograms). The two
token counters follow the same prefix; TensorRT-LLM's documentation lists no such counters, so
a router must not rely on them. ``GET /version`` answers ``{"version": ...}``.
"""

from engine_advisor.model.engines.base import (
    DTYPE_BYTES,
    GIB,
    NO_STATE,
    Engine,
    EngineCapabilities,
    HybridShape,
    Metrics,
    PrefixReuse,
    StateLayout,
)

DEFAULT_FREE_FRACTION = 0.9      # KvCacheConfig.free_gpu_memory_fraction's default
TOKENS_PER_BLOCK = 32            # KvCacheConfig.tokens_per_block's default
DEFAULT_MAX_BATCH = 2048         # BuildConfig.max_batch_size's default (--max_batch_size)
CONFIG_PATH = "/etc/trtllm/extra-llm-api-config.yml"
EXPERIMENTAL = ("TensorRT-LLM's Helix (context_parallel_size with cp_config.cp_type HELIX) is "
                "experimental (a prototype feature), decode-only: it belongs on the generation "
                "servers of a disaggregated deployment whose prefill servers run CP 1, for MLA "
                "models on Blackwell; its cost here is the DCP physics prior, never measured")


def free_fraction(fraction: float, memory: float, used: float) -> float:
    """TensorRT-LLM's ``--kv_cache_free_gpu_memory_fraction`` for a whole-GPU fraction
    ``fraction`` of ``memory`` bytes, ``used`` bytes per GPU being in use before the KV cache:
    (fraction x memory - used) / (memory - used), within 0 .. 1 (module docstring)."""
    free = memory - used
    if free <= 0:
        return 0.0
    return min(max((fraction * memory - used) / free, 0.0), 1.0)


def kv_budget(free: float, memory: float, used: float) -> float:
    """Bytes per GPU TensorRT-LLM gives its KV cache at ``--kv_cache_free_gpu_memory_fraction``
    ``free``: that share of what is free after ``used``."""
    return free * max(memory - used, 0.0)


def config_file(dcp: int, fraction: float, kv_dtype: str) -> dict:
    """The ``--config`` YAML's content: the KV cache's free-memory fraction, block size and
    block reuse (and its dtype when not the model's), the metrics a router reads, and at DCP >
    1 Helix's context parallelism with matching blocks."""
    kv: dict = {"free_gpu_memory_fraction": round(fraction, 2),
                "tokens_per_block": TOKENS_PER_BLOCK, "enable_block_reuse": True}
    if kv_dtype == "fp8":
        kv["dtype"] = "fp8"
    out: dict = {"kv_cache_config": kv, "enable_iter_perf_stats": True,
                 "return_perf_metrics": True}
    if dcp > 1:
        out["context_parallel_size"] = dcp
        out["cp_config"] = {"cp_type": "HELIX", "tokens_per_block": TOKENS_PER_BLOCK}
    return out


def parallel_args(num_gpus: int, dcp: int) -> list[str]:
    """World size = tp x cp: ``num_gpus`` GPUs at CP ``dcp`` run ``--tp_size num_gpus / dcp``
    and ``--cp_size dcp`` (written when > 1)."""
    out = ["--tp_size", str(max(num_gpus // max(dcp, 1), 1))]
    return out + (["--cp_size", str(dcp)] if dcp > 1 else [])


def state_layout(h: HybridShape) -> StateLayout:
    """A hybrid's recurrent state at ``mamba_ssm_cache_dtype`` "auto" (the model config's, else
    float32), convolution window in bf16, one per running request beside the KV blocks: costed
    per sequence (a prior: no start-up log backs it)."""
    ssm = DTYPE_BYTES.get(h.ssm_cache_dtype or h.ssm_dtype or "float32", 4)
    state = h.n_linear * (h.conv_elems * 2 + h.ssm_elems * ssm)
    return StateLayout(NO_STATE, state_bytes=state, unit_bytes=0.0,
                       default_running=DEFAULT_MAX_BATCH,
                       notes=("linear-attention state: one slot per running request, "
                              "mamba_ssm_cache_dtype auto",))


ENGINE = Engine(
    name="trtllm",
    label="TensorRT-LLM",
    program=("trtllm-serve",),
    model_flag=None,
    tp_flag="--tp_size",
    dcp_flag="--cp_size",
    max_running_flag="--max_batch_size",
    kv_dtype_flag="kv_cache_config.dtype",     # a key of the --config file, not a flag
    kv_dtype_values={},
    mem_flag="--kv_cache_free_gpu_memory_fraction",
    mem_covers="the KV cache only, as a share of the memory free after the weights and the "
               "profiled activations and buffers (not of the whole GPU)",
    reserve_bytes=1.0 * GIB,
    counts_activations=True,
    dcp_attention=frozenset({"mla"}),
    prefill_graph_tokens=0,
    prefill_graph_attention=frozenset(),
    capabilities=EngineCapabilities(
        hardware_vendors=["nvidia"],
        quantization=["fp8", "nvfp4", "mxfp4", "int4", "int8", "awq", "gptq", "w8a8_int8",
                      "w8a8_fp8"],
        speculative_methods=["draft_model", "eagle", "eagle3", "medusa", "mtp", "ngram",
                             "lookahead"],
        lora=True,
        pipeline_parallel=True,
        dp_attention=True,
        prefix_reuse=PrefixReuse(
            kind="KV cache block reuse: whole blocks of tokens_per_block tokens, on by default "
                 "(enable_block_reuse)",
            block_tokens=TOKENS_PER_BLOCK)),
    metrics=Metrics(
        running="trtllm_num_requests_running",
        waiting="trtllm_num_requests_waiting",
        kv_usage="trtllm_kv_cache_utilization",
        ttft="trtllm_time_to_first_token_seconds",
        inter_token="trtllm_time_per_output_token_seconds",
        e2e="trtllm_e2e_request_latency_seconds",
        prompt_tokens="trtllm_prompt_tokens_total",
        generation_tokens="trtllm_generation_tokens_total",
        prefixes=("trtllm_",)),
    info_paths=("/version",),
    image="nvcr.io/nvidia/tensorrt-llm/release",
    port=8000,
    state_layout=state_layout,
    default_running=lambda gib: DEFAULT_MAX_BATCH,
    flag_fraction=free_fraction,
    config_flag="--config",
    config_path=CONFIG_PATH,
    config_file=config_file,
    parallel_args=parallel_args,
    dcp_gpu_families=frozenset({"blackwell"}),
    dcp_note=EXPERIMENTAL,
    default_candidate=False,
    # the chunked delta-rule kernels (KDA, GDN): TensorRT-LLM runs Kimi-K3's KDA through fla-core,
    # the kernel family vLLM's and SGLang's profiles measured at 4.8 and 4.4 x the physics;
    # aiconfigurator-core 0.12.0's GDN tables put TensorRT-LLM's between the two engines' on the
    # same shapes, so its prior is their midpoint (docs/trtllm-validation.md). Mamba2's SSD stays
    # at the physics: aiconfigurator has no other engine's Mamba2 table to scale from
    kernel_priors=(("pf_linear", 4.6),),
    uncalibrated_note="TensorRT-LLM cannot be installed here (PyPI's tensorrt-llm is a stub "
                      "pointing at NVIDIA's own index), so no calibration data exist: its "
                      "predictions are the physics priors until you calibrate it on your own "
                      "node (engine-advisor calibrate run --engine trtllm)",
)
