"""``calibrate gpu`` measurements: decode attention over a grid, HBM reads, per-call overhead.

Needs PyTorch with a CUDA device (and Triton for the MLA shapes). Every measurement becomes one row
of ``engine_advisor.calibration.kernels.gpu_profile.ROW_COLUMNS``, which turns the rows into the
hardware profile. Imports nothing from pydantic or the rest of the package, so it runs on a bare GPU
image.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F

from engine_advisor.calibration.kernels.gpu_timing import host_call_overhead, time_calls

# name -> (impl, q_heads, kv_heads, head_dim, v_dim); GQA groups of 8 query heads per KV head.
SHAPES: dict[str, tuple[str, int, int, int, int]] = {
    "gqa-8x128": ("sdpa", 64, 8, 128, 128),
    "gqa-4x128": ("sdpa", 32, 4, 128, 128),
    "gqa-1x128": ("sdpa", 8, 1, 128, 128),
    "mla-128h": ("triton", 128, 1, 576, 512),
    "mla-64h": ("triton", 64, 1, 576, 512),
}
BATCHES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = tuple(4096 * 2**i for i in range(7))            # 4K ... 256K
QUICK_SHAPES = ("gqa-8x128", "gqa-1x128", "mla-128h")
QUICK_BATCHES = (1, 8, 64)
QUICK_CONTEXTS = (4096, 32768, 262144)
HBM_SIZES = tuple(2**k for k in range(20, 34))              # 1 MiB ... 8 GiB per call
MLA_CONFIGS = (  # (block_h, block_n, num_warps, num_stages); the first is the fallback
    (32, 64, 4, 2), (64, 32, 8, 2), (64, 64, 8, 1), (32, 32, 4, 2), (64, 32, 4, 2),
    (32, 64, 8, 2), (64, 32, 8, 3), (32, 128, 8, 1), (16, 64, 4, 2), (16, 128, 4, 1))
DTYPES = {"bf16": torch.bfloat16, "fp8": getattr(torch, "float8_e4m3fn", None)}
ROTATE_BYTES_FACTOR = 4     # rotate inputs over >= 4x the L2 size
MAX_ROTATION = 64
MAX_HBM_ROTATION = 256


def elem_bytes(dtype: str) -> int:
    return 1 if dtype == "fp8" else 2


def kv_bytes(shape: str, dtype: str, batch: int, ctx: int) -> int:
    impl, _, kvh, hd, _ = SHAPES[shape]
    per_token = hd if impl == "triton" else 2 * kvh * hd
    return batch * ctx * per_token * elem_bytes(dtype)


def attn_flops(shape: str, batch: int, ctx: int) -> float:
    _, qh, _, hd, vd = SHAPES[shape]
    return 2.0 * batch * qh * ctx * (hd + vd)


class Bench:
    """One GPU: its properties, a memory budget, and the row builder."""

    def __init__(self, device: int = 0, mem_fraction: float = 0.7, repeats: int = 15,
                 log: Callable[[str], None] | None = None):
        self.device = torch.device("cuda", device)
        torch.cuda.set_device(self.device)
        props = torch.cuda.get_device_properties(self.device)
        self.name = props.name
        self.memory_bytes = int(props.total_memory)
        self.sm_count = int(props.multi_processor_count)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 50 * 2**20))
        self.budget = int(self.memory_bytes * mem_fraction)
        self.repeats = repeats
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.rows: list[dict] = []
        self.skipped: list[str] = []
        self.mla_config = MLA_CONFIGS[0]

    def rotation(self, nbytes: int, cap: int = MAX_ROTATION) -> int:
        return max(1, min(cap, math.ceil(ROTATE_BYTES_FACTOR * self.l2_bytes / nbytes)))

    def add(self, kind: str, shape: str, impl: str, dtype: str, timing: dict, *, nbytes: int,
            batch: int = 0, ctx: int = 0, q_heads: int = 0, kv_heads: int = 0, head_dim: int = 0,
            v_dim: int = 0, flops: float = 0.0, note: str = "") -> dict:
        row = {"gpu": self.name, "kind": kind, "shape": shape, "impl": impl, "dtype": dtype,
               "batch_size": batch, "context_tokens": ctx, "q_heads": q_heads,
               "kv_heads": kv_heads, "head_dim": head_dim, "v_dim": v_dim, "bytes_read": nbytes,
               "flops": flops, "seconds": timing["median_s"], "seconds_min": timing["min_s"],
               "seconds_max": timing["max_s"], "calls_per_replay": timing["calls_per_replay"],
               "timing": timing["mode"],
               "bandwidth_Bps": nbytes / timing["median_s"] if nbytes else 0.0, "note": note}
        self.rows.append(row)
        return row

    # ------------------------------------------------------------------ plain HBM reads
    def hbm(self, sizes: Iterable[int] = HBM_SIZES) -> None:
        for size in sizes:
            n_sets = self.rotation(size, MAX_HBM_ROTATION)
            if size * n_sets > self.budget:
                continue
            xs = [torch.rand(size // 4, device=self.device) for _ in range(n_sets)]
            calls = [(lambda x=x: torch.sum(x)) for x in xs]
            r = self.add("hbm_read", "sum-fp32", "torch.sum", "fp32",
                         time_calls(calls, self.repeats), nbytes=size)
            self.log(f"hbm_read {size / 2**20:9.1f} MiB  {r['bandwidth_Bps'] / 1e12:6.3f} TB/s")
            del xs, calls
        size = 2**32
        if 2 * size <= self.budget:
            x = torch.rand(size // 4, device=self.device)
            y = torch.empty_like(x)
            r = self.add("copy", "copy-fp32", "Tensor.copy_", "fp32",
                         time_calls([lambda: y.copy_(x)], self.repeats), nbytes=2 * size,
                         note="bytes = read + write")
            self.log(f"copy 4 GiB read+write {r['bandwidth_Bps'] / 1e12:6.3f} TB/s")
            del x, y
        torch.cuda.empty_cache()

    def overheads(self) -> None:
        x = torch.zeros(1, device=self.device)
        self.add("overhead", "graph-call", "Tensor.add_", "fp32",
                 time_calls([lambda: x.add_(1.0)], self.repeats), nbytes=0,
                 note="one trivial kernel per call inside a CUDA graph")
        host = host_call_overhead()
        self.add("overhead", "eager-host-call", "Tensor.add_", "fp32",
                 {"median_s": host, "min_s": host, "max_s": host, "calls_per_replay": 2000,
                  "mode": "host"}, nbytes=0, note="host seconds per eager launch")
        self.log(f"overhead: graph call {self.rows[-2]['seconds'] * 1e6:.2f} us, eager host "
                 f"{host * 1e6:.2f} us")

    # ------------------------------------------------------------------------ attention
    def _sdpa_calls(self, shape: str, dtype: str, batch: int, ctx: int, n_sets: int):
        _, qh, kvh, hd, _ = SHAPES[shape]
        dt = DTYPES[dtype]
        sets = []
        for _ in range(n_sets):
            q = torch.randn(batch, qh, 1, hd, device=self.device, dtype=torch.bfloat16).to(dt)
            k = torch.randn(batch, kvh, ctx, hd, device=self.device, dtype=torch.bfloat16).to(dt)
            v = torch.randn(batch, kvh, ctx, hd, device=self.device, dtype=torch.bfloat16).to(dt)
            sets.append((q, k, v))
        from torch.nn.attention import SDPBackend, sdpa_kernel

        fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.CUDNN_ATTENTION]

        def make(q, k, v):
            def call():
                with sdpa_kernel(fused):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            return call

        return [make(*s) for s in sets], sets

    def _mla_calls(self, shape: str, dtype: str, batch: int, ctx: int, n_sets: int,
                   config=None):
        from engine_advisor.calibration.kernels.mla_decode import MlaPlan, mla_decode

        _, qh, _, hd, _ = SHAPES[shape]
        bh, bn, nw, ns = config or self.mla_config
        plan = MlaPlan(batch, qh, ctx, self.device, block_h=bh, block_n=bn, num_warps=nw,
                       num_stages=ns, target_programs=2 * self.sm_count)
        out = torch.empty(batch, qh, 512, device=self.device, dtype=torch.bfloat16)
        lse = torch.empty(batch, qh, device=self.device, dtype=torch.float32)
        sets = []
        for _ in range(n_sets):
            q = torch.randn(batch, qh, hd, device=self.device, dtype=torch.bfloat16)
            kv = torch.randn(batch, ctx, hd, device=self.device, dtype=torch.bfloat16)
            sets.append((q, kv.to(DTYPES[dtype]) if dtype != "bf16" else kv))
        scale = hd ** -0.5
        calls = [(lambda q=q, kv=kv: mla_decode(q, kv, scale, plan, out, lse)) for q, kv in sets]
        return calls, (sets, plan, out, lse)

    def attention(self, shape: str, dtype: str, batch: int, ctx: int) -> dict | None:
        impl, qh, kvh, hd, vd = SHAPES[shape]
        nbytes = kv_bytes(shape, dtype, batch, ctx)
        n_sets = self.rotation(nbytes)
        label = f"{shape} {dtype} b{batch} ctx{ctx}"
        if nbytes * n_sets * (2 if dtype == "fp8" else 1) > self.budget:
            self.skipped.append(f"{label}: {nbytes / 1e9:.1f} GB of KV over the memory budget")
            return None
        try:
            maker = self._sdpa_calls if impl == "sdpa" else self._mla_calls
            calls, keep = maker(shape, dtype, batch, ctx, n_sets)
            timing = time_calls(calls, self.repeats)
        except (RuntimeError, torch.OutOfMemoryError, TypeError, ValueError) as exc:
            msg = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            self.skipped.append(f"{label}: {msg}")
            self.log(f"skip {label}: {msg}")
            torch.cuda.empty_cache()
            return None
        del calls, keep
        torch.cuda.empty_cache()
        r = self.add("attention", shape, impl, dtype, timing, nbytes=nbytes, batch=batch,
                     ctx=ctx, q_heads=qh, kv_heads=kvh, head_dim=hd, v_dim=vd,
                     flops=attn_flops(shape, batch, ctx))
        self.log(f"{label:32s} {timing['median_s'] * 1e6:10.1f} us  "
                 f"{r['bandwidth_Bps'] / 1e12:6.3f} TB/s  ({timing['mode']})")
        return r

    def tune_mla(self, batch: int = 8, ctx: int = 32768) -> list[dict]:
        results = []
        best = None
        for cfg in MLA_CONFIGS:
            try:
                calls, keep = self._mla_calls("mla-128h", "bf16", batch, ctx,
                                              self.rotation(kv_bytes("mla-128h", "bf16", batch,
                                                                     ctx)), cfg)
                t = time_calls(calls, 7)["median_s"]
                del calls, keep
            except Exception as exc:  # noqa: BLE001 - compiler resource errors vary by version
                results.append({"config": list(cfg), "error": str(exc).splitlines()[0][:120]})
                continue
            results.append({"config": list(cfg), "seconds": t})
            self.log(f"mla config {cfg}: {t * 1e6:.1f} us")
            if best is None or t < best[1]:
                best = (cfg, t)
        if best is None:
            raise RuntimeError("no MLA kernel configuration compiled on this GPU")
        self.mla_config = best[0]
        torch.cuda.empty_cache()
        return results

    def check_mla(self) -> dict:
        """Relative error of the Triton kernel against the fp32 reference (fresh inputs)."""
        from engine_advisor.calibration.kernels.mla_decode import mla_decode, mla_decode_reference

        bh, bn, nw, ns = self.mla_config
        out = {}
        for dtype, (batch, heads, ctx) in (("bf16", (3, 128, 5000)), ("bf16", (2, 64, 777)),
                                           ("fp8", (2, 128, 4099))):
            if DTYPES.get(dtype) is None:
                continue
            q = torch.randn(batch, heads, 576, device=self.device, dtype=torch.bfloat16)
            kv = torch.randn(batch, ctx, 576, device=self.device, dtype=torch.bfloat16)
            kv = kv.to(DTYPES[dtype])
            o = torch.full((batch, heads, 512), float("nan"), device=self.device,
                           dtype=torch.bfloat16)
            lse = torch.full((batch, heads), float("nan"), device=self.device)
            mla_decode(q, kv, 576**-0.5, None, o, lse, block_h=bh, block_n=bn, num_warps=nw,
                       num_stages=ns)
            ro, rl = mla_decode_reference(q, kv.to(torch.bfloat16), 576**-0.5)
            err = float((o.float() - ro).norm() / ro.norm())
            lerr = float((lse - rl).abs().max())
            key = f"{dtype}-b{batch}-h{heads}-n{ctx}"
            out[key] = {"rel_err": err, "lse_max_abs_err": lerr,
                        "all_written": bool(torch.isfinite(o).all() and torch.isfinite(lse).all())}
            self.log(f"mla check {key}: rel err {err:.2e}, lse err {lerr:.2e}")
        return out


def grid(quick: bool) -> dict:
    return {"shapes": list(QUICK_SHAPES if quick else SHAPES),
            "batches": list(QUICK_BATCHES if quick else BATCHES),
            "contexts": list(QUICK_CONTEXTS if quick else CONTEXTS),
            "dtypes": {"sdpa": ["bf16"], "triton": ["bf16"] if quick else ["bf16", "fp8"]}}


def software() -> dict:
    info = {"torch": torch.__version__, "cuda": torch.version.cuda or "",
            "python": sys.version.split()[0]}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = ""
    return info


def run(device: int = 0, quick: bool = False, log: Callable[[str], None] | None = None) -> dict:
    """All measurements of ``calibrate gpu``; returns rows and metadata for the profile."""
    bench = Bench(device, repeats=9 if quick else 15, log=log)
    g = grid(quick)
    bench.overheads()
    bench.hbm(HBM_SIZES[::3] if quick else HBM_SIZES)
    meta: dict = {"gpu": bench.name, "memory_bytes": bench.memory_bytes,
                  "sm_count": bench.sm_count, "l2_bytes": bench.l2_bytes, "software": software(),
                  "grid": g}
    if any(SHAPES[s][0] == "triton" for s in g["shapes"]):
        try:
            meta["mla_tuning"] = bench.tune_mla()
            meta["mla_config"] = list(bench.mla_config)
            meta["mla_check"] = bench.check_mla()
        except (ImportError, RuntimeError) as exc:
            bench.skipped.append(f"MLA shapes: {exc}")
            g["shapes"] = [s for s in g["shapes"] if SHAPES[s][0] != "triton"]
    # tiny calls: the fixed per-call cost of an attention kernel
    for shape in g["shapes"]:
        r = bench.attention(shape, "bf16", 1, 16)
        if r is not None:
            bench.rows.remove(r)
            r["kind"] = "overhead"
            r["note"] = "attention over 16 tokens: the per-call floor"
            bench.rows.append(r)
    for shape in g["shapes"]:
        for dtype in g["dtypes"][SHAPES[shape][0]]:
            for batch in g["batches"]:
                for ctx in g["contexts"]:
                    bench.attention(shape, dtype, batch, ctx)
    meta["skipped"] = bench.skipped
    return {"rows": bench.rows, "meta": meta}
