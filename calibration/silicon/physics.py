"""From aiconfigurator-core's per-operation tables (columns as arrays,
engine_advisor.calibration.silicon.tables) to the numbers of a GPU profile: read curves, achievable
FLOP/s, collective fits.

What the tables measure (NVIDIA's collectors, one GPU, one layer per call): each call is captured
in a CUDA graph and replayed back to back, ``latency`` is the mean milliseconds per replay. The
engine's own attention layer is called, so a decode call includes writing the new token's KV and
the engine's per-layer metadata kernels, not only the attention kernel.

How a row maps to one GPU's call (docs/silicon-profiles.md):

- MLA decode (``generation_mla_perf``): ``num_heads`` is the query heads on this GPU (the model's
  heads / ``tp_size``; ``tp_size`` only labels how they arose, the kernel is the same). All query
  heads share one latent KV head of 576 values (kv_lora_rank 512 + rope 64), so one call reads
  ``batch x (step + 1) x 576 x dtype bytes``: ``step`` is the tokens already cached, the call
  attends over them plus the new one.
- GQA decode (``generation_attention_perf``): ``num_heads`` / ``num_key_value_heads`` are per
  GPU; a call reads ``batch x (step + 1) x kv_heads x head_dim x 2 (K and V) x dtype bytes``.
- Prefill (``context_mla_perf``, ``context_attention_perf``): FLOPs of causal attention over
  ``isl`` new tokens, ``batch x heads x (qk_dim + v_dim) x isl^2`` (two FLOPs per multiply-add
  over half the score matrix, for both products). MLA prefill on the trtllm_mla kernel, and every
  MLA prefill of TensorRT-LLM's own tables, runs the non-absorbed form (qk 192, v 128: the
  latent KV is expanded per head before the attention kernel); the other MLA kernels run the
  absorbed one (576, 512). Counted absorbed, TensorRT-LLM's H200 rows would run at 1.9 PFLOP/s,
  twice the GPU's dense bf16 peak; non-absorbed they run at 0.56, and on B300 at 1.3, where
  SGLang's trtllm_mla rows run at 1.4.
- GEMM (``gemm_perf``): ``2 m n k`` FLOPs; ``n x k`` weights.
- Collectives (``nccl_perf``, the engine's ``custom_allreduce_perf``): ``message_size`` counts
  elements of the per-rank buffer as nccl-tests sizes it (all-reduce: the reduced buffer;
  all-gather / reduce-scatter: the whole gathered buffer; all-to-all: the send buffer).
"""

from __future__ import annotations

import numpy as np

from engine_advisor.model.hardware.profiles import fit_linear_pos, fit_read_curve, median_rel_error

MS = 1e-3
MLA_KV_DIM = 576                      # kv_lora_rank 512 + qk_rope_head_dim 64
DEFAULT_MLA_HEADS = (8, 16)           # query heads per GPU of a 64-128-head model at TP 8
GQA_SHAPES = ((8, 1), (32, 4), (64, 8))   # (query heads, KV heads) per GPU, groups of 8
GQA_HEAD_DIM = 128
CONTEXT_MIN_ISL = 4096                # "large" prefill shapes
CONTEXT_MIN_HEADS = 8
GEMM_LARGE_M, GEMM_LARGE_NK = 4096, 1024
GEMM_SMALL_M, GEMM_MIN_WEIGHTS = 16, 2**26   # weights beyond any L2, read from HBM
DTYPES = {"bfloat16": "bf16", "float16": "bf16", "fp8": "fp8"}
ELEM_BYTES = {"bf16": 2, "fp8": 1}
WEIGHT_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int8": 1.0,
                "nvfp4": 0.5 + 1 / 16,   # 4-bit values + one fp8 scale per 16
                "mxfp4": 0.5 + 1 / 32, "int4": 0.5, "w4a16": 0.5}
MLA_PREFILL_DIMS = {"trtllm_mla": (192, 128)}
MLA_PREFILL_NON_ABSORBED_ENGINES = ("trtllm",)   # whatever their kernel_source says
MLA_PREFILL_ABSORBED = (MLA_KV_DIM, 512)
COLLECTIVES = ("all_reduce", "all_gather", "alltoall", "reduce_scatter")
NCCL_ELEM_BYTES = {"half": 2, "bfloat16": 2, "float16": 2, "int8": 1}


# --------------------------------------------------------------------------- helpers
def _label(raw: str) -> str | None:
    return DTYPES.get(raw.lower())


def pick_kernel(kernels: np.ndarray) -> str:
    """The kernel a table measured most, the Triton fallbacks only when nothing else is there."""
    names, counts = np.unique(kernels.astype(str), return_counts=True)
    fused = [(c, n) for n, c in zip(names, counts, strict=True) if "triton" not in n.lower()]
    return max(fused or [(c, n) for n, c in zip(names, counts, strict=True)])[1]


def _curve(nbytes: np.ndarray, seconds: np.ndarray, spec_bw: float | None) -> dict:
    c = fit_read_curve(nbytes, seconds, float(seconds.min()))
    c["peak_Bps"] = float(np.max(nbytes / seconds))
    if spec_bw:
        c["asymptotic_fraction_of_spec"] = c["asymptotic_Bps"] / spec_bw
    return c


# --------------------------------------------------------------------------- decode attention
MLA_COLS = {"kernel_source": str, "kv_cache_dtype": str, "num_heads": float,
            "batch_size": float, "step": float, "latency": float, "device": str}
GQA_COLS = {"kernel_source": str, "kv_cache_dtype": str, "num_heads": float,
            "num_key_value_heads": float, "head_dim": float, "batch_size": float, "step": float,
            "window_size": float, "latency": float}


def mla_decode(t: dict, spec_bw: float | None) -> dict:
    """Per KV dtype: the read curve over the default heads, and one per heads-per-GPU count."""
    out = {}
    kernel = pick_kernel(t["kernel_source"])
    for raw in sorted(set(t["kv_cache_dtype"])):
        label = _label(raw)
        sel = (t["kv_cache_dtype"] == raw) & (t["kernel_source"] == kernel)
        if label is None or sel.sum() < 2:
            continue
        nbytes = t["batch_size"][sel] * (t["step"][sel] + 1) * MLA_KV_DIM * ELEM_BYTES[label]
        sec = t["latency"][sel] * MS
        heads = t["num_heads"][sel]
        by_heads = {str(int(h)): _curve(nbytes[heads == h], sec[heads == h], spec_bw)
                    for h in np.unique(heads) if (heads == h).sum() >= 2}
        dflt = np.isin(heads, DEFAULT_MLA_HEADS)
        if dflt.sum() < 2:
            dflt = np.ones_like(heads, dtype=bool)
        out[label] = {**_curve(nbytes[dflt], sec[dflt], spec_bw), "kernel": kernel,
                      "heads_per_gpu": sorted(int(h) for h in np.unique(heads[dflt])),
                      "by_heads": by_heads}
    return out


def _gqa_shape_mask(t: dict) -> np.ndarray:
    m = np.zeros(len(t["latency"]), dtype=bool)
    for q, kv in GQA_SHAPES:
        m |= (t["num_heads"] == q) & (t["num_key_value_heads"] == kv)
    return m & (t["head_dim"] == GQA_HEAD_DIM) & (t["window_size"] == 0)


def gqa_decode(t: dict, spec_bw: float | None) -> dict:
    base = _gqa_shape_mask(t)
    if not base.any():
        return {}
    kernel = pick_kernel(t["kernel_source"][base])
    base &= t["kernel_source"] == kernel
    out = {}
    for raw in sorted(set(t["kv_cache_dtype"][base])):
        label = _label(raw)
        sel = base & (t["kv_cache_dtype"] == raw)
        if label is None or sel.sum() < 2:
            continue
        nbytes = (t["batch_size"][sel] * (t["step"][sel] + 1) * t["num_key_value_heads"][sel]
                  * GQA_HEAD_DIM * 2 * ELEM_BYTES[label])
        out[label] = {**_curve(nbytes, t["latency"][sel] * MS, spec_bw), "kernel": kernel,
                      "shapes": [f"{q}q/{kv}kv x {GQA_HEAD_DIM}" for q, kv in GQA_SHAPES]}
    return out


# --------------------------------------------------------------------------- prefill attention
CTX_MLA_COLS = {"kernel_source": str, "kv_cache_dtype": str, "num_heads": float,
                "batch_size": float, "isl": float, "latency": float}
CTX_GQA_COLS = {"kernel_source": str, "attn_dtype": str, "kv_cache_dtype": str,
                "num_heads": float, "num_key_value_heads": float, "head_dim": float,
                "batch_size": float, "isl": float, "window_size": float, "latency": float}


def _flops_summary(flops: np.ndarray, sec: np.ndarray, **extra) -> dict:
    f = flops / sec
    return {"achievable_flops": float(np.median(f)), "max_flops": float(f.max()),
            "n_points": int(len(f)), **extra}


def mla_prefill(t: dict, engine: str = "") -> dict:
    kernel = pick_kernel(t["kernel_source"])
    qk, v = (MLA_PREFILL_DIMS["trtllm_mla"] if engine in MLA_PREFILL_NON_ABSORBED_ENGINES
             else MLA_PREFILL_DIMS.get(kernel, MLA_PREFILL_ABSORBED))
    big = ((t["kernel_source"] == kernel) & (t["isl"] >= CONTEXT_MIN_ISL)
           & (t["num_heads"] >= CONTEXT_MIN_HEADS))
    out = {}
    for raw in sorted(set(t["kv_cache_dtype"][big])):
        label = _label(raw)
        sel = big & (t["kv_cache_dtype"] == raw)
        if label is None or not sel.any():
            continue
        flops = t["batch_size"][sel] * t["num_heads"][sel] * (qk + v) * t["isl"][sel] ** 2
        out[label] = _flops_summary(flops, t["latency"][sel] * MS, kernel=kernel, qk_dim=qk,
                                    v_dim=v)
    return out


def gqa_prefill(t: dict) -> dict:
    base = _gqa_shape_mask(t) & (t["isl"] >= CONTEXT_MIN_ISL)
    if not base.any():
        return {}
    kernel = pick_kernel(t["kernel_source"][base])
    base &= (t["kernel_source"] == kernel) & (t["attn_dtype"] == t["kv_cache_dtype"])
    out = {}
    for raw in sorted(set(t["attn_dtype"][base])):
        label = _label(raw)
        sel = base & (t["attn_dtype"] == raw)
        if label is None or not sel.any():
            continue
        flops = (t["batch_size"][sel] * t["num_heads"][sel] * 2 * GQA_HEAD_DIM
                 * t["isl"][sel] ** 2)
        out[label] = _flops_summary(flops, t["latency"][sel] * MS, kernel=kernel,
                                    qk_dim=GQA_HEAD_DIM, v_dim=GQA_HEAD_DIM)
    return out


# --------------------------------------------------------------------------- fused MoE
MOE_COLS = {"moe_dtype": str, "num_tokens": float, "hidden_size": float, "inter_size": float,
            "topk": float, "num_experts": float, "moe_tp_size": float, "moe_ep_size": float,
            "latency": float}
# the experts' formats a fused-MoE floor is fitted for, by the table's name (the names the
# served model's shape gives its routed experts: engine_advisor.model.hardware.silicon)
MOE_DTYPES = {"bfloat16": "bf16", "fp8_block": "fp8_block", "fp8": "fp8", "nvfp4": "nvfp4"}
MOE_FLOOR_MAX_ERROR = 0.15    # a format whose floors the line misses by more is left out


def moe_floor(t: dict, spec_bw: float | None) -> dict:
    """One fused-MoE call's floor per experts' format: what a call routing one token costs
    beyond reading its experts' weights, as ``base_s + per_expert_s x experts``. Per shape of
    the table (experts, hidden, intermediate, top-k, no expert parallelism), the call at one
    token at the MoE TP size where it takes least, less its ``top-k x 3 x hidden x
    intermediate / TP`` weight bytes at the spec-sheet bandwidth; then a least-squares line over
    the shapes' expert counts (TensorRT-LLM's kernels on B300: about 25 us at 8 experts, 55 at
    256 with nvfp4, 90 with fp8 blocks). ``experts_range`` is the counts measured. A format
    the line misses by more than ``MOE_FLOOR_MAX_ERROR`` in the median is left out: its
    predictions keep the silicon's constant floor."""
    one = (t["num_tokens"] == 1) & (t["moe_ep_size"] == 1)
    out = {}
    for raw, label in MOE_DTYPES.items():
        sel = one & (t["moe_dtype"] == raw)
        if not sel.any():
            continue
        floors: dict[tuple, float] = {}
        for i in np.flatnonzero(sel):
            key = (t["num_experts"][i], t["hidden_size"][i], t["inter_size"][i], t["topk"][i])
            nbytes = (t["topk"][i] * 3 * t["hidden_size"][i] * t["inter_size"][i]
                      / t["moe_tp_size"][i] * WEIGHT_BYTES[raw])
            sec = t["latency"][i] * MS - (nbytes / spec_bw if spec_bw else 0.0)
            floors[key] = min(floors.get(key, np.inf), max(sec, 0.0))
        if len(floors) < 3:
            continue
        e = np.array([k[0] for k in floors], dtype=float)
        y = np.array(list(floors.values()))
        # a line with both coefficients >= 0: least squares, else the least-squares line
        # through the origin, else (no growth with the experts) the median floor
        slope, base = np.polyfit(e, y, 1) if np.ptp(e) > 0 else (0.0, float(np.median(y)))
        if slope < 0:
            slope, base = 0.0, float(np.median(y))
        elif base < 0:
            slope, base = float(e @ y / (e @ e)), 0.0
        slope, base = float(slope), float(base)
        fit = base + slope * e
        seen = y > 0          # a call the spec-sheet read of its bytes already accounts for
        err = float(np.median(np.abs(fit - y)[seen] / y[seen])) if seen.any() else 0.0
        if err > MOE_FLOOR_MAX_ERROR:   # not a line (B200's nvfp4 kernels step up past 256)
            continue
        out[label] = {"base_s": max(base, 0.0), "per_expert_s": slope,
                      "experts_range": [int(e.min()), int(e.max())], "n_shapes": int(len(y)),
                      "median_rel_error": err}
    return out


# --------------------------------------------------------------------------- GEMM
GEMM_COLS = {"kernel_source": str, "gemm_dtype": str, "m": float, "n": float, "k": float,
             "latency": float}


def gemm(t: dict) -> dict:
    out = {}
    for dtype in sorted(set(t["gemm_dtype"])):
        d = t["gemm_dtype"] == dtype
        sec = t["latency"] * MS
        big = d & (t["m"] >= GEMM_LARGE_M) & (t["n"] >= GEMM_LARGE_NK) & (t["k"] >= GEMM_LARGE_NK)
        small = d & (t["m"] <= GEMM_SMALL_M) & (t["n"] * t["k"] >= GEMM_MIN_WEIGHTS)
        entry: dict = {"kernel": ", ".join(sorted(set(t["kernel_source"][d]))),
                       "overhead_s": float(sec[d].min()), "n_points": int(big.sum()),
                       "achievable_flops": None, "weight_read_Bps": None}
        if big.any():
            entry["achievable_flops"] = float(np.median(
                2 * t["m"][big] * t["n"][big] * t["k"][big] / sec[big]))
        wb = WEIGHT_BYTES.get(dtype.lower())
        if small.any() and wb:
            entry["weight_read_Bps"] = float(np.median(
                t["n"][small] * t["k"][small] * wb / sec[small]))
            entry["weight_bytes_per_element"] = wb
            entry["n_weight_read_points"] = int(small.sum())
        out[dtype] = entry
    return out


# --------------------------------------------------------------------------- collectives
NCCL_COLS = {"op_name": str, "nccl_dtype": str, "num_gpus": float, "message_size": float,
             "latency": float}
CUSTOM_AR_COLS = {"op_name": str, "kernel_source": str, "allreduce_dtype": str,
                  "num_gpus": float, "message_size": float, "latency": float}


def fit_collective(nbytes: np.ndarray, seconds: np.ndarray) -> dict:
    """t(bytes) = latency_s + bytes / bandwidth_Bps: non-negative, relative-error least squares."""
    a, s = fit_linear_pos(nbytes, seconds)
    med, mx = median_rel_error(a + s * nbytes, seconds)
    return {"latency_s": a, "bandwidth_Bps": 1.0 / s if s > 0 else None,
            "n_points": int(len(nbytes)), "bytes_range": [float(nbytes.min()),
                                                         float(nbytes.max())],
            "median_rel_err": med, "max_rel_err": mx}


def _per_size(op_sel: np.ndarray, t: dict, elem_bytes: np.ndarray) -> dict:
    out = {}
    for n in sorted(set(t["num_gpus"][op_sel])):
        sel = op_sel & (t["num_gpus"] == n)
        if sel.sum() >= 2:
            out[str(int(n))] = fit_collective(t["message_size"][sel] * elem_bytes[sel],
                                              t["latency"][sel] * MS)
    return out


def nccl(t: dict) -> dict:
    eb = np.array([NCCL_ELEM_BYTES.get(d.lower(), 0) for d in t["nccl_dtype"]], dtype=float)
    wide = eb == 2 if (eb == 2).any() else eb > 0     # half precision where measured
    out = {}
    for op in COLLECTIVES:
        fits = _per_size(wide & (t["op_name"] == op), t, eb)
        if fits:
            out[op] = fits
    return out


def custom_all_reduce(t: dict) -> dict:
    eb = np.array([NCCL_ELEM_BYTES.get(d.lower(), 0) for d in t["allreduce_dtype"]], float)
    graph = np.array(["graph" in k.lower() for k in t["kernel_source"]])
    sel = (t["op_name"] == "all_reduce") & (eb > 0) & (graph if graph.any() else True)
    fits = _per_size(sel, t, eb)
    kernels = sorted(set(t["kernel_source"][sel]))
    return {"kernel": ", ".join(kernels), **fits} if fits else {}
