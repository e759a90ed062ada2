"""vLLM (``vllm serve``), from its documentation and a real 0.26.0 on one H200.

Memory: ``--gpu-memory-utilization`` budgets the whole instance. "Actual usage is 29.34 GiB for
weight, 1.09 GiB for peak activation, 0.23 GiB for non-torch memory, and 1.2 GiB for CUDAGraph
memory" (deepseek-v2-lite; llama-3.1-8b: 1.1 and 0.22 GiB): the KV budget is fraction x memory
- weights - peak activation - non-torch ("Available KV cache memory: 95.16 GiB" = 0.9 x 139.8 -
29.34 - 1.09 - 0.23). The CUDA graphs are captured afterwards, outside it (hence OOM near
0.95). The activation peak is the model's (``model.physics.memory.activation_peak_bytes``); the
non-torch memory is the reserve. NCCL buffers at TP > 1 are not counted.

Prefill CUDA graphs: 0.26.0 captures piecewise graphs of mixed prefill-decode batches of up to
512 tokens (``cudagraph_capture_sizes`` 1 ... 512, ``max_cudagraph_capture_size`` 512, mode
FULL_AND_PIECEWISE); larger passes run the compiled model kernel by kernel.

DCP (``--decode-context-parallel-size``): tp % dcp == 0, and on GQA models
(tp // kv_heads) % dcp == 0. Capabilities as the architecture comparison of vLLM and SGLang
summarises the official documentation.
"""

from model.engines.base import (
    GIB,
    Engine,
    EngineCapabilities,
    Incompatibility,
    Metrics,
    PrefixReuse,
)

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
)
