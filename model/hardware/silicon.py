"""The GPU's physics: what one call of each operation costs on one GPU type.

A ``Silicon`` answers, in seconds, the questions the cost model's terms ask:

- ``attn_read_s(family, dtype, bytes)``: one decode-attention call (one layer, the whole batch on
  this GPU) that reads ``bytes`` of KV cache;
- ``weight_read_Bps``: bytes/s at which small-batch GEMMs stream their weights;
- ``gemm_flops(dtype)`` / ``attn_flops``: achievable FLOP/s of large GEMMs and prefill attention;
- ``all_reduce_s(bytes, n)`` / ``all_gather_s(bytes, n)``: one collective over ``n`` GPUs;
- ``moe_call_s(expert_dtype, n_experts)``: the floor of one fused-MoE call, what it costs when
  it reads almost nothing (an engine's own measured floor, else ``MOE_CALL_S``).

Each answer comes from a measured profile when one covers it (``calibration/profiles/*.json``: the
project's own kernel measurements, or NVIDIA's per-op tables imported from aiconfigurator) and from
the spec sheet otherwise; ``sources`` says which, per quantity, and predictions quote it. Spec-sheet
values are peaks: the engines' fitted efficiencies (engine_advisor.model.fit.estimator) scale them.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache

import numpy as np

from engine_advisor.model.formulas.hardware import collective_many, collective_s
from engine_advisor.model.hardware.gpus import GpuSpec, gpu_family
from engine_advisor.model.hardware.profiles import (
    KIND_DCP,
    KIND_GPU,
    PROFILES_ENV,
    ReadCurve,
    cache_generation,
    find_profiles,
    profiles_dir,
)

# The floor of one fused-MoE call (seconds): the engines' MoE op at one token in
# aiconfigurator-core 0.12.0's moe_perf tables (vLLM 0.24.0, SGLang 0.5.14), the fastest shape of
# each kernel, where the experts' bytes take 0-5 us. Hopper (H200) runs Triton / CUTLASS fused
# MoE: vLLM bf16 22.8, fp8 blocks 28.9 (FlashInfer CUTLASS 23.5), SGLang bf16 16.3, fp8 20.0 us.
# Blackwell (B200, B300, GB300) runs TRT-LLM's monolithic MoE kernels: 12.0-17.7 us over bf16,
# fp8, nvfp4 and mxfp4 in both engines. 4-bit weight-only experts (AWQ / GPTQ / int4 QAT) run
# Marlin-style dequantising kernels on either family: vLLM 39-41 us, SGLang 24-34 us. A family
# without tables takes Hopper's. The routing kernels before the call (router GEMM, top-k) and
# an untuned kernel configuration are the engine's: its fitted coefficient of ``moe_fixed``.
MOE_CALL_S = {"hopper": 22e-6, "blackwell": 14e-6}
MOE_CALL_WEIGHT_ONLY_4BIT_S = 35e-6
# Spec fallbacks where a GPU entry or profile is silent (documented in docs/cost-model.md).
SPEC_COLLECTIVE_LATENCY_S = 8e-6  # one NCCL / custom all-reduce step on NVLink, small message
CUSTOM_ALL_REDUCE_MAX_BYTES = 8 << 20   # engines switch from their custom all-reduce to NCCL
SPEC_NVLINK_BPS = 450e9         # per direction, when a custom GPU gives no NVLink bandwidth
ATTENTION_FAMILIES = ("mla", "gqa")
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "fp8_block": "fp8_block"}
# Share of a spec-sheet peak that well-tuned kernels reach (measured profiles replace these):
# HBM reads 85 % (the H200 profile measures 96 % for plain reads, 80-90 % for GEMV / attention),
# large GEMMs 70 % of dense peak, prefill attention 60 % (FlashAttention-3 class kernels).
SPEC_EFFICIENCY = {"hbm": 0.85, "gemm": 0.70, "attn": 0.60}


def _valid_curve(curve) -> bool:
    try:
        kb, kt = np.asarray(curve["bytes"], float), np.asarray(curve["seconds"], float)
        return (len(kb) >= 1 and len(kb) == len(kt) and bool(np.all(np.diff(kb) > 0))
                and bool(np.all(np.diff(kt) > 0)) and float(curve["overhead_s"]) >= 0
                and float(curve["asymptotic_Bps"]) > 0 and bool(np.all(kt > 0)))
    except (KeyError, TypeError, ValueError):
        return False


def _valid_moe(fit) -> bool:
    try:
        lo, hi = fit["experts_range"]
        return (float(fit["base_s"]) >= 0 and float(fit["per_expert_s"]) >= 0
                and 0 < int(lo) <= int(hi))
    except (KeyError, TypeError, ValueError):
        return False


def _moe_format(dtype: str) -> str | None:
    """A served model's routed-experts format ('fp8 block 128x128', 'bf16', 'nvfp4', ...) as
    a profile's ``moe_call`` names it; None for a format no table measures (MXFP4, int4)."""
    if "block" in dtype:
        return "fp8_block"
    for key, fmt in (("nvfp4", "nvfp4"), ("fp8", "fp8"), ("bf16", "bf16"),
                     ("bfloat16", "bf16"), ("fp16", "bf16")):
        if dtype.startswith(key):
            return fmt
    return None


def _family_of_shape(shape: str) -> tuple[str, str] | None:
    """'mla-128h/bf16' -> ('mla', 'bf16'); the shapes of a ``calibrate gpu`` profile."""
    name, _, dtype = shape.partition("/")
    family = name.split("-")[0]
    return (family, dtype or "bf16") if family in ATTENTION_FAMILIES else None


class Silicon:
    """Per-call costs of one GPU type (see module docstring)."""

    def __init__(self, gpu: GpuSpec, profiles: list[tuple[str, dict]] = (),
                 dcp_profile: tuple[str, dict] | None = None, peak: bool = False,
                 own: list[tuple[str, dict]] = (), engine: str | None = None):
        """``peak``: spec-sheet peaks, no profile (the roofline: nothing can be faster).
        ``own``: ``engine``'s own kernel tables, read before the shared ``profiles``
        (``for_engine``)."""
        self.gpu = gpu
        self.engine = engine
        # the silicon of each engine that has kernel tables of its own on this GPU (for_engine);
        # only the profiles directory's silicon (silicon_for) looks for them
        self._engines: dict[str, Silicon] | None = None
        self._shared = (list(profiles), dcp_profile)
        self.peak = peak
        self.eff = {k: 1.0 for k in SPEC_EFFICIENCY} if peak else dict(SPEC_EFFICIENCY)
        self.name = gpu.name.upper()
        self.sources: dict[str, str] = {}
        self._curves: dict[tuple[str, str], dict] = {}
        self._read: dict[tuple[str, str], object] = {}   # read curves by the family, dtype asked
        self._matmul: dict[tuple, float] = {}
        self._curve_src: dict[tuple[str, str], str] = {}
        self._gemm: dict[str, dict] = {}
        self._coll: dict[str, dict[int, tuple[float, float]]] = {}
        self._attn_flops: float | None = None
        self._collectives: dict[tuple[str, float], Collective] = {}
        # Engine-kernel tables (schema 2, imported) before the project's own kernels: the
        # engines run FlashMLA / FlashInfer / TRT-LLM kernels, ours is a Triton stand-in.
        ranked = sorted(profiles, key=lambda p: (0 if p[1].get("source", {}).get("engine")
                                                 else 1, p[0]))
        # one fused-MoE call's measured floor per experts' format, from the engine's own
        # tables only: vLLM's and SGLang's fitted moe_fixed carry theirs over MOE_CALL_S
        self._moe: dict[str, dict] = {}
        for file_name, prof in sorted(own, key=lambda p: p[0]):
            for fmt, fit in (prof.get("moe_call") or {}).items():
                if fmt not in self._moe and _valid_moe(fit):
                    self._moe[fmt] = fit
                    self.sources.setdefault("moe_call", f"profile:{file_name}")
        for file_name, prof in [*sorted(own, key=lambda p: p[0]), *ranked]:
            self._absorb(file_name, prof)
        if dcp_profile is not None:
            self._absorb_dcp(*dcp_profile)
        self.sources.setdefault("kv_read", "spec")
        self.sources.setdefault("gemm", "spec")
        self.sources.setdefault("collectives", "spec")

    # ------------------------------------------------------------------ profile reading
    def _absorb(self, file_name: str, prof: dict) -> None:
        src = f"profile:{file_name}"
        found = []
        for family, by_dtype in (prof.get("attention") or {}).items():
            for dtype, curve in (by_dtype or {}).items():
                found.append(((family, dtype), curve))
        for shape, entry in (prof.get("shapes") or {}).items():
            key = _family_of_shape(shape)
            if key is not None and isinstance(entry, dict):
                found.append((key, entry.get("curve")))
        for key, curve in found:
            if key not in self._curves and _valid_curve(curve):
                self._curves[key] = curve
                self._curve_src[key] = src
        if self._curves and "kv_read" not in self.sources:
            self.sources["kv_read"] = src
        for dtype, g in (prof.get("gemm") or {}).items():
            dtype = DTYPE_ALIASES.get(dtype, dtype)
            if dtype not in self._gemm and isinstance(g, dict):
                self._gemm[dtype] = g
                self.sources.setdefault("gemm", src)
        for op, by_n in (prof.get("collectives") or {}).items():
            table = self._coll.setdefault(op, {})
            for n, fit in (by_n or {}).items():
                try:
                    lat, bw = float(fit["latency_s"]), float(fit["bandwidth_Bps"])
                except (KeyError, TypeError, ValueError):
                    continue
                if int(n) not in table and lat >= 0 and bw > 0:
                    table[int(n)] = (lat, bw)
                    self.sources.setdefault("collectives", src)
        ca = prof.get("context_attention") or {}
        for family in ATTENTION_FAMILIES:
            f = (ca.get(family) or {}).get("bf16", {}).get("achievable_flops")
            if self._attn_flops is None and f:
                self._attn_flops = float(f)
                self.sources.setdefault("attn_flops", src)

    def _absorb_dcp(self, file_name: str, prof: dict) -> None:
        """A ``calibrate dcp`` profile: its measured all-gather fits the DCP collectives."""
        for op, key in (("all_gather", "all_gather"), ("all_to_all", "alltoall")):
            for n, fit in (prof.get("collectives", {}).get(op) or {}).items():
                table = self._coll.setdefault(key, {})
                if int(n) not in table:
                    table[int(n)] = (float(fit["latency_s"]), float(fit["bandwidth_Bps"]))
                    self.sources["dcp_collectives"] = f"profile:{file_name}"

    def for_engine(self, engine: str) -> Silicon:
        """The silicon ``engine``'s predictions run on: this GPU's physics with the engine's own
        kernel tables first, where the profiles directory holds some for it (its subdirectory
        ``<engine>/``, e.g. TensorRT-LLM's tables imported from aiconfigurator:
        ``calibrate import --format aiconfigurator --engine trtllm``), else this silicon itself.
        An engine runs its own attention kernels: on H200, TensorRT-LLM's fp8 MLA decode reads
        at 3.1 TB/s where SGLang's reads at 0.3 (aiconfigurator-core 0.12.0's tables), so one
        GPU's physics is not every engine's."""
        if self._engines is None:
            return self
        hit = self._engines.get(engine)
        if hit is None:
            own = find_profiles(self.gpu.name, KIND_GPU, engine)
            hit = self._engines[engine] = (Silicon(self.gpu, *self._shared, own=own,
                                                   engine=engine) if own else self)
        return hit

    @property
    def provenance(self) -> str:
        """Where this GPU's physics came from, per quantity: measured profiles or the spec
        sheet (a recommendation's reason)."""
        hit = self.__dict__.get("_provenance")
        if hit is None:
            parts = [f"{k.replace('_', ' ')} from {v.removeprefix('profile:')}"
                     for k, v in sorted(self.sources.items())]
            hit = self.__dict__["_provenance"] = f"{self.name} physics: " + "; ".join(parts)
        return hit

    # ------------------------------------------------------------------ attention reads
    def read_source(self, family: str, dtype: str) -> str:
        return self._curve_src.get(self._curve_key(family, dtype) or ("", ""), "spec")

    def _curve_key(self, family: str, dtype: str) -> tuple[str, str] | None:
        fam = family if family in ATTENTION_FAMILIES else "mla"
        for key in ((fam, dtype), (fam, "bf16")):
            if key in self._curves:
                return key
        return None

    def attn_read_s(self, family: str, dtype: str, nbytes):
        """Seconds of one decode-attention call reading ``nbytes`` of KV (a float or an
        array)."""
        return self.read_curve(family, dtype)(nbytes)

    def read_curve(self, family: str, dtype: str):
        """The function bytes -> seconds of one decode-attention call of ``family`` at KV
        ``dtype``: the measured read curve (one of another KV dtype of the same family is used
        at the same bytes: fp8 reads half the bytes of bf16 for the same tokens), else the
        spec sheet's HBM bandwidth at typical efficiency."""
        try:
            return self._read[(family, dtype)]
        except KeyError:
            key = self._curve_key(family, dtype)
            bps = self.gpu.hbm_bandwidth * self.eff["hbm"]
            fn = self._read[(family, dtype)] = (ReadCurve(self._curves[key]) if key
                                                else ReadCurve.spec(bps))
            return fn

    def heads_ratio(self, family: str, dtype: str, heads_from: float, heads_to: float,
                    nbytes) -> np.ndarray | None:
        """How much longer one decode-attention call reading ``nbytes`` (array) takes with
        ``heads_to`` query heads per GPU than with ``heads_from``: the ratio of the measured
        per-head-count curves (``by_heads`` of an engine-kernel table), each count between two
        measured ones interpolated in log heads, clamped to the measured range. None when the
        profile measured one head count only (the project's kernels, the spec sheet): the read
        then does not depend on the heads."""
        key = self._curve_key(family, dtype)
        by = (self._curves[key].get("by_heads") or {}) if key else {}
        counts = sorted(int(h) for h in by)
        if len(counts) < 2:
            return None
        x = np.atleast_1d(np.asarray(nbytes, dtype=float))

        def at(h: float) -> np.ndarray:
            h = min(max(float(h), counts[0]), counts[-1])
            hi = next(c for c in counts if c >= h)
            lo = max(c for c in counts if c <= h)
            t_hi = ReadCurve(by[str(hi)])(x)
            if hi == lo:
                return t_hi
            w = math.log(h / lo) / math.log(hi / lo)
            return np.exp((1.0 - w) * np.log(ReadCurve(by[str(lo)])(x)) + w * np.log(t_hi))

        return at(heads_to) / at(heads_from)

    def asymptotic_read_Bps(self, family: str, dtype: str) -> float:
        key = self._curve_key(family, dtype)
        return (float(self._curves[key]["asymptotic_Bps"]) if key
                else float(self.gpu.hbm_bandwidth) * self.eff["hbm"])

    # ------------------------------------------------------------------ GEMMs
    def _gemm_entry(self, dtype: str) -> dict | None:
        for key in (dtype, {"fp4": "nvfp4", "mxfp4": "nvfp4"}.get(dtype, dtype), "bf16"):
            if key in self._gemm:
                return self._gemm[key]
        return None

    @property
    def weight_read_Bps(self) -> float:
        """Bytes/s at which bf16 GEMMs stream their weights (measured, else the derated HBM)."""
        return self.weight_read_for("bf16")

    def weight_read_for(self, weight_dtype: str) -> float:
        """Bytes/s at which GEMMs of a weight format stream their weights: the measured kernel
        of that format (fp8 per-tensor, fp8 blocks, a 4-bit format's nvfp4 kernel), else
        bf16's, else the derated HBM bandwidth. A label such as 'fp8 block 128x128' or
        'mxfp4 g32' names its format first."""
        d = weight_dtype.lower()
        key = ("fp8_block" if "fp8" in d and "block" in d else "fp8" if "fp8" in d
               else "nvfp4" if any(k in d for k in ("fp4", "int4", "awq", "gptq")) else "bf16")
        for k in (key, "bf16"):
            g = self._gemm.get(k)
            if g and g.get("weight_read_Bps"):
                return float(g["weight_read_Bps"])
        return float(self.gpu.hbm_bandwidth) * self.eff["hbm"]

    def moe_call_s(self, expert_dtype: str, n_experts: int = 0) -> float:
        """Seconds of one fused-MoE call that reads almost nothing: the engine's own kernels'
        measured floor for the experts' format, ``base + per expert x n_experts`` (the count
        clamped to the measured range), where its tables have one (``for_engine``), else
        ``MOE_CALL_S``; 0 at spec-sheet peaks (the roofline counts bytes and FLOPs only)."""
        if self.peak:
            return 0.0
        d = expert_dtype.lower()
        fit = self._moe.get(_moe_format(d)) if self._moe else None
        if fit is not None:
            lo, hi = fit["experts_range"]
            return fit["base_s"] + fit["per_expert_s"] * min(max(n_experts, lo), hi)
        if any(k in d for k in ("int4", "awq", "gptq", "w4a16")):
            return MOE_CALL_WEIGHT_ONLY_4BIT_S
        return MOE_CALL_S.get(gpu_family(self.name), MOE_CALL_S["hopper"])

    def matmul_s_per_token(self, flops_by_dtype: tuple[tuple[str, float], ...]) -> float:
        """Seconds of one token's matmuls: each compute dtype's FLOPs at its achievable rate
        (memoised per FLOP breakdown)."""
        hit = self._matmul.get(flops_by_dtype)
        if hit is None:
            hit = self._matmul[flops_by_dtype] = sum(f / self.gemm_flops(dtype)
                                                     for dtype, f in flops_by_dtype)
        return hit

    def gemm_flops(self, dtype: str) -> float:
        """Achievable (measured) or peak (spec) dense FLOP/s of GEMMs in ``dtype``."""
        g = self._gemm.get(dtype) or self._gemm.get({"fp4": "nvfp4"}.get(dtype, dtype))
        if g and g.get("achievable_flops"):
            return float(g["achievable_flops"])
        spec = self.spec_flops(dtype)
        base = self._gemm.get("bf16")
        if base and base.get("achievable_flops"):  # measured bf16 efficiency carried over
            return spec * float(base["achievable_flops"]) / self.spec_flops("bf16")
        return spec * self.eff["gemm"]

    def spec_flops(self, dtype: str) -> float:
        """Dense spec-sheet FLOP/s of ``dtype`` math (engine_advisor.model.hardware.gpus: assumed
        from the memory bandwidth where a custom GPU gives none)."""
        math_dtype = {"fp4": "fp4", "nvfp4": "fp4", "mxfp4": "fp4", "fp8": "fp8",
                      "fp8_block": "fp8"}.get(dtype, "bf16")
        return float(self.gpu.flops(math_dtype)[0])

    @property
    def stream_Bps(self) -> float:
        """Bytes/s of kernels that stream state through HBM (linear attention's recurrent
        state and chunk states): the derated spec bandwidth (the spec itself at peaks)."""
        return float(self.gpu.hbm_bandwidth) * self.eff["hbm"]

    @property
    def attn_flops(self) -> float:
        return self._attn_flops or self.spec_flops("bf16") * self.eff["attn"]

    # ------------------------------------------------------------------ collectives
    def _link(self, op: str, n: float) -> tuple[float, float]:
        """(latency, bandwidth) of ``op`` over ``n`` GPUs: measured where the profile has that
        group size (the nearest measured size otherwise), else the spec sheet."""
        table = self._link_tables().get(op)
        if table is None:
            return SPEC_COLLECTIVE_LATENCY_S, float(self.gpu.nvlink_bandwidth or SPEC_NVLINK_BPS)
        log_sizes, lat, bw = table
        i = int(np.abs(math.log2(max(n, 1.0)) - log_sizes).argmin())
        return float(lat[i]), float(bw[i])

    def _link_tables(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        tables = self.__dict__.get("_tables")
        if tables is None:
            tables = {}
            for op in ("all_reduce", "custom_all_reduce", "all_gather", "alltoall"):
                t = self._coll.get(op) or (self._coll.get("all_reduce") if op != "all_reduce"
                                           else None)
                if t:
                    sizes = sorted(t)
                    tables[op] = (np.log2(np.array(sizes, dtype=float)),
                                  np.array([t[k][0] for k in sizes]),
                                  np.array([t[k][1] for k in sizes]))
            self.__dict__["_tables"] = tables
        return tables

    def collective(self, op: str, n) -> Collective:
        """The cost of one ``op`` ("all_reduce" or "all_gather") over ``n`` GPUs as a function
        of bytes (memoised per group size).

        all_reduce, spec: latency + 2 (n-1)/n x bytes / link bandwidth (ring); measured: the
        profile's latency + bytes / its fitted bandwidth (bytes as its table defines them);
        messages up to ``CUSTOM_ALL_REDUCE_MAX_BYTES`` on the engines' one-shot custom kernel
        where the profile measures it. all_gather of a result of ``bytes`` per rank: latency +
        (n-1)/n x bytes / bandwidth. Zero for n = 1."""
        key = (op, n)
        hit = self._collectives.get(key)
        if hit is not None:
            return hit
        if n <= 1:
            c = Collective(0.0, 1.0, 0.0)
        else:
            lat, bw = self._link(op, float(n))
            share = (n - 1) / n
            if op == "all_gather":
                c = Collective(lat, bw, share)
            else:
                factor = 1.0 if "all_reduce" in self._coll else 2.0 * share
                if "custom_all_reduce" in self._link_tables():
                    c_lat, c_bw = self._link("custom_all_reduce", float(n))
                    c = Collective(lat, bw, factor, CUSTOM_ALL_REDUCE_MAX_BYTES, c_lat, c_bw)
                else:
                    c = Collective(lat, bw, factor)
        self._collectives[key] = c
        return c

    def all_reduce_s(self, nbytes, n):
        """One all-reduce of ``nbytes`` per rank over ``n`` GPUs (floats or arrays)."""
        return self._over_groups("all_reduce", nbytes, n)

    def all_gather_s(self, nbytes, n):
        """One all-gather whose gathered result is ``nbytes`` per rank, over ``n`` GPUs."""
        return self._over_groups("all_gather", nbytes, n)

    def _over_groups(self, op: str, nbytes, n):
        if not isinstance(n, np.ndarray):
            return self.collective(op, float(n))(nbytes)
        nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), n.shape)
        out = np.zeros(n.shape)
        for size in np.unique(n).tolist():
            rows = n == size
            out[rows] = self.collective(op, float(size))(nbytes[rows])
        return out


class Collective:
    """Seconds of one collective of a fixed group as a function of the bytes per rank:
    ``latency + bytes x factor / bandwidth``, or the small-message kernel's
    ``small_latency + bytes / small_bandwidth`` up to ``small_max`` bytes (``collective_s``).
    Floats or arrays."""

    __slots__ = ("params", "_table")

    def __init__(self, lat: float, bw: float, factor: float, small_max: float = -1.0,
                 small_lat: float = 0.0, small_bw: float = 1.0):
        self.params = np.array([lat, bw, factor, small_max, small_lat, small_bw], dtype=float)
        self._table = self.params[None, :]

    def __call__(self, nbytes):
        if isinstance(nbytes, np.ndarray):
            x = np.ascontiguousarray(nbytes, dtype=float)
            return collective_many(x.ravel(), self._table, 0).reshape(x.shape)
        return collective_s(float(nbytes), self._table, 0)


@lru_cache(maxsize=64)
def roofline_silicon(gpu: GpuSpec) -> Silicon:
    """Spec-sheet peaks only: times on it are lower bounds (``fit`` warns below them)."""
    return Silicon(gpu, peak=True)


def silicon_for(gpu: GpuSpec) -> Silicon:
    """The Silicon of a GPU type: its profiles in the profiles directory, else spec only.
    Cached per process and profile-cache generation (``clear_profile_cache`` refreshes)."""
    key = (id(gpu), os.environ.get(PROFILES_ENV), cache_generation())
    hit = _BY_OBJECT.get(key)     # the hot path: no hashing of the GPU's fields
    if hit is not None and hit.gpu is gpu:
        return hit
    si = _silicon(gpu, str(profiles_dir()), cache_generation())
    if len(_BY_OBJECT) >= 256:
        _BY_OBJECT.clear()
    _BY_OBJECT[key] = si          # holds the GPU object, so its id is not reused meanwhile
    return si


_BY_OBJECT: dict[tuple, Silicon] = {}


@lru_cache(maxsize=64)
def _silicon(gpu: GpuSpec, directory: str, generation: int) -> Silicon:
    dcp = find_profiles(gpu.name, KIND_DCP)
    si = Silicon(gpu, find_profiles(gpu.name, KIND_GPU), dcp[0] if dcp else None)
    si._engines = {}          # looks for the engines' own kernel tables (Silicon.for_engine)
    return si
