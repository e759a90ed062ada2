"""``calibrate dcp`` measurements: split-KV decode attention + DCP combine across processes.

One process per GPU (torch.distributed; NCCL on GPUs, gloo on CPUs for tests). For each DCP size
``d`` the machine allows (2, 4, 8, ...), the first ``d`` ranks form a group. Token ``i`` of every
sequence lives on rank ``i mod d`` (the engines' striping); each rank runs MLA decode attention
over its slice, then the partial outputs and log-sum-exps are combined in two ways:

- ``ag``: all-gather of every rank's partials of all heads, then a local merge (engines' ag_rs);
- ``a2a``: all-to-all, each rank receiving the partials of its 1/d of the heads, then a merge.

Per (backend, dcp, batch, context) one ``dcp_step`` row holds the attention, communication and
merge seconds of one layer, their sequence timed together (``total_s``), and the full-context
attention on one GPU (``dcp1_s``). ``collective`` rows time the bare collectives over message
sizes. A correctness check compares the merged output with full attention on one rank.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from engine_advisor.calibration.kernels.mla_torch import D_LAT, D_ROPE
from engine_advisor.calibration.ports import free_port

# NVLink multicast stays off (a shared host's GPUs can be put out of service by it).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
BACKENDS = ("ag", "a2a")
HEADS = 128
D_KV = D_LAT + D_ROPE
BATCHES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = tuple(1024 * 2**i for i in range(9))            # 1K ... 256K
QUICK_BATCHES = (1, 8, 64)
QUICK_CONTEXTS = (4096, 32768, 262144)
MESSAGE_SIZES = tuple(4096 * 4**i for i in range(9))       # 4 KiB ... 256 MiB per rank
CHECK_BATCH, CHECK_CONTEXT = 2, 4096


def set_safe_env() -> None:
    for k, v in SAFE_ENV.items():
        os.environ[k] = v



_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_gather(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    """All-gather ``inp`` of every rank into ``out`` (d, *inp.shape), stacked on dim 0."""
    _ALL_GATHER(out.view(-1, *inp.shape[1:]), inp, group=group)


def merge_partials(o: torch.Tensor, lse: torch.Tensor,
                   out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge partials o (d, B, h, Dv) with natural-log LSEs (d, B, h) into (B, h, Dv), (B, h)."""
    m = lse.amax(0)
    w = torch.exp(lse - m)
    s = w.sum(0)
    out = (o.float() * (w / s)[..., None]).sum(0).to(out_dtype)
    return out, m + torch.log(s)


class Rank:
    """This process's device, timers and attention function."""

    def __init__(self, rank: int, world: int, device: torch.device, repeats: int):
        self.rank, self.world, self.device, self.repeats = rank, world, device, repeats
        self.cuda = device.type == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.name = torch.cuda.get_device_name(device) if self.cuda else "cpu"
        self.l2 = (int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size",
                               50 * 2**20)) if self.cuda else 0)
        self.sms = (torch.cuda.get_device_properties(device).multi_processor_count
                    if self.cuda else 4)
        self.mla_config = (32, 64, 4, 2)

    def attention_fn(self, batch: int, ctx: int) -> Callable[[torch.Tensor, torch.Tensor],
                                                              tuple[torch.Tensor, torch.Tensor]]:
        scale = D_KV ** -0.5
        if not self.cuda:
            from engine_advisor.calibration.kernels.mla_torch import mla_decode_reference

            return lambda q, kv: mla_decode_reference(q, kv, scale)
        from engine_advisor.calibration.kernels.mla_decode import MlaPlan, mla_decode

        bh, bn, nw, ns = self.mla_config
        plan = MlaPlan(batch, HEADS, ctx, self.device, block_h=bh, block_n=bn, num_warps=nw,
                       num_stages=ns, target_programs=2 * self.sms)
        out = torch.empty(batch, HEADS, D_LAT, device=self.device, dtype=self.dtype)
        lse = torch.empty(batch, HEADS, device=self.device, dtype=torch.float32)
        return lambda q, kv: mla_decode(q, kv, scale, plan, out, lse)

    def time(self, calls: Sequence[Callable[[], object]], n: int,
             group=None) -> tuple[float, str]:
        """Median seconds per call; with ``group`` the slowest rank's median (collectives)."""
        if self.cuda:
            from engine_advisor.calibration.kernels.gpu_timing import time_calls

            r = time_calls(calls, self.repeats, n_calls=n)
            med, mode = r["median_s"], r["mode"]
        else:
            for c in calls:
                c()
            samples = []
            for _ in range(self.repeats):
                if group is not None:
                    dist.barrier(group=group)
                t0 = time.perf_counter()
                for i in range(n):
                    calls[i % len(calls)]()
                samples.append((time.perf_counter() - t0) / n)
            med, mode = statistics.median(samples), "wall"
        if group is not None:
            t = torch.tensor([med], device=self.device, dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            med = float(t.item())
        return med, mode

    def rotation(self, nbytes: int) -> int:
        return max(1, min(32, -(-4 * self.l2 // max(nbytes, 1)))) if self.cuda else 1

    def randn(self, *shape, generator=None) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=self.dtype, generator=generator)


def _calls_per_replay(rank: Rank, seconds_hint: float) -> int:
    return max(1, min(64, int(2e-3 / max(seconds_hint, 1e-6)))) if rank.cuda else 3


def attention_time(rank: Rank, batch: int, ctx: int) -> float:
    """Seconds of MLA decode attention of ``batch`` sequences over ``ctx`` tokens on this rank."""
    nbytes = batch * ctx * D_KV * (2 if rank.cuda else 4)
    sets = [(rank.randn(batch, HEADS, D_KV), rank.randn(batch, ctx, D_KV))
            for _ in range(rank.rotation(nbytes))]
    fn = rank.attention_fn(batch, ctx)
    calls = [(lambda q=q, kv=kv: fn(q, kv)) for q, kv in sets]
    if rank.cuda:
        from engine_advisor.calibration.kernels.gpu_timing import time_calls

        return time_calls(calls, rank.repeats)["median_s"]
    return rank.time(calls, 2)[0]


class StepBench:
    """The buffers and calls of one DCP layer step on this rank."""

    def __init__(self, rank: Rank, group, d: int, batch: int, ctx: int, backend: str):
        self.rank, self.group, self.d, self.batch, self.backend = rank, group, d, batch, backend
        self.local_ctx = ctx // d
        self.q = rank.randn(batch, HEADS, D_KV)
        self.kv = rank.randn(batch, self.local_ctx, D_KV)
        self.attn = rank.attention_fn(batch, self.local_ctx)
        h = HEADS // d
        dev, dt = rank.device, rank.dtype
        o, lse = self.attn(self.q, self.kv)
        self.o, self.lse = o, lse
        if backend == "ag":
            self.o_recv = torch.empty(d, batch, HEADS, D_LAT, device=dev, dtype=dt)
            self.l_recv = torch.empty(d, batch, HEADS, device=dev, dtype=torch.float32)
            self.message = batch * HEADS * (D_LAT * o.element_size() + 4)
        else:
            self.o_send = o.reshape(batch, d, h, D_LAT).transpose(0, 1).contiguous()
            self.l_send = lse.reshape(batch, d, h).transpose(0, 1).contiguous()
            self.o_recv = torch.empty(d, batch, h, D_LAT, device=dev, dtype=dt)
            self.l_recv = torch.empty(d, batch, h, device=dev, dtype=torch.float32)
            self.message = batch * HEADS * (D_LAT * o.element_size() + 4)

    def comm(self) -> None:
        if self.backend == "ag":
            _all_gather(self.o_recv, self.o, group=self.group)
            _all_gather(self.l_recv, self.lse, group=self.group)
        else:
            dist.all_to_all_single(self.o_recv, self.o_send, group=self.group)
            dist.all_to_all_single(self.l_recv, self.l_send, group=self.group)

    def merge(self):
        return merge_partials(self.o_recv, self.l_recv, self.rank.dtype)

    def step(self):
        o, lse = self.attn(self.q, self.kv)
        if self.backend == "ag":
            _all_gather(self.o_recv, o, group=self.group)
            _all_gather(self.l_recv, lse, group=self.group)
        else:
            b, d = self.batch, self.d
            self.o_send.copy_(o.reshape(b, d, -1, D_LAT).transpose(0, 1))
            self.l_send.copy_(lse.reshape(b, d, -1).transpose(0, 1))
            dist.all_to_all_single(self.o_recv, self.o_send, group=self.group)
            dist.all_to_all_single(self.l_recv, self.l_send, group=self.group)
        return self.merge()


def check(rank: Rank, group, d: int) -> dict:
    """Merged DCP output vs full attention on one rank (same seeded inputs on every rank)."""
    gen = torch.Generator(device=rank.device)
    gen.manual_seed(1234)
    q = rank.randn(CHECK_BATCH, HEADS, D_KV, generator=gen)
    kv_full = rank.randn(CHECK_BATCH, CHECK_CONTEXT, D_KV, generator=gen)
    kv = kv_full[:, rank.rank::d].contiguous()            # token i on rank i mod d
    o, lse = rank.attention_fn(CHECK_BATCH, kv.shape[1])(q, kv)
    o, lse = o.clone(), lse.clone()
    out = {}
    from engine_advisor.calibration.kernels.mla_torch import mla_decode_reference

    ref_o, ref_l = mla_decode_reference(q, kv_full, D_KV ** -0.5)
    for backend in BACKENDS:
        h = HEADS // d
        if backend == "ag":
            o_all = torch.empty(d, *o.shape, device=rank.device, dtype=o.dtype)
            l_all = torch.empty(d, *lse.shape, device=rank.device, dtype=torch.float32)
            _all_gather(o_all, o, group=group)
            _all_gather(l_all, lse, group=group)
            merged, mlse = merge_partials(o_all, l_all, rank.dtype)
        else:
            o_send = o.reshape(CHECK_BATCH, d, h, D_LAT).transpose(0, 1).contiguous()
            l_send = lse.reshape(CHECK_BATCH, d, h).transpose(0, 1).contiguous()
            o_recv, l_recv = torch.empty_like(o_send), torch.empty_like(l_send)
            dist.all_to_all_single(o_recv, o_send, group=group)
            dist.all_to_all_single(l_recv, l_send, group=group)
            mine, mine_l = merge_partials(o_recv, l_recv, rank.dtype)   # (B, h, Dv): my heads
            g_o = torch.empty(d, *mine.shape, device=rank.device, dtype=mine.dtype)
            g_l = torch.empty(d, *mine_l.shape, device=rank.device, dtype=torch.float32)
            _all_gather(g_o, mine.contiguous(), group=group)
            _all_gather(g_l, mine_l.contiguous(), group=group)
            merged = g_o.permute(1, 0, 2, 3).reshape(CHECK_BATCH, HEADS, D_LAT)
            mlse = g_l.permute(1, 0, 2).reshape(CHECK_BATCH, HEADS)
        err = float((merged.float() - ref_o).norm() / ref_o.norm())
        lerr = float((mlse - ref_l).abs().max())
        t = torch.tensor([err, lerr], device=rank.device, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        out[backend] = {"rel_err": float(t[0]), "lse_max_abs_err": float(t[1]),
                        "batch": CHECK_BATCH, "context_tokens": CHECK_CONTEXT}
    return out


def collectives(rank: Rank, group, d: int, sizes: Sequence[int]) -> list[dict]:
    """Bare all-gather and all-to-all of ``size`` bytes per rank: latency and bandwidth."""
    rows = []
    for size in sizes:
        n_el = max(d, size // 2 // d * d)       # bf16/fp32 elements, a multiple of d
        x = torch.ones(n_el, device=rank.device, dtype=rank.dtype)
        ag_out = torch.empty(d * n_el, device=rank.device, dtype=rank.dtype)
        a2a_out = torch.empty_like(x)
        msg = n_el * x.element_size()
        ops = (("all_gather", partial(_ALL_GATHER, ag_out, x, group=group), (d - 1) * msg),
               ("all_to_all", partial(dist.all_to_all_single, a2a_out, x, group=group),
                (d - 1) * msg // d))
        for op, call, recv in ops:
            sec, mode = rank.time([call], 8 if rank.cuda else 3, group)
            rows.append({"kind": "collective", "backend": op, "dcp": d, "message_bytes": msg,
                         "recv_bytes": recv, "comm_s": sec, "timing": mode})
    return rows


def step_rows(rank: Rank, group, d: int, batches, contexts, dcp1: dict) -> list[dict]:
    rows = []
    for batch in batches:
        for ctx in contexts:
            if ctx % d:
                continue
            for backend in BACKENDS:
                if HEADS % d:
                    continue
                sb = StepBench(rank, group, d, batch, ctx, backend)
                attn = attention_time(rank, batch, sb.local_ctx)
                t = torch.tensor([attn], device=rank.device, dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
                attn = float(t.item())
                comm, mode = rank.time([sb.comm], _calls_per_replay(rank, 2e-5), group)
                merge, _ = rank.time([sb.merge], _calls_per_replay(rank, 1e-5), group)
                total, _ = rank.time([sb.step], _calls_per_replay(rank, attn + comm + merge),
                                     group)
                rows.append({"kind": "dcp_step", "backend": backend, "dcp": d,
                             "batch_size": batch, "context_tokens": ctx, "q_heads": HEADS,
                             "message_bytes": sb.message,
                             "recv_bytes": (d - 1) * sb.message if backend == "ag"
                             else (d - 1) * sb.message // d,
                             "attn_s": attn, "comm_s": comm, "merge_s": merge, "total_s": total,
                             "dcp1_s": dcp1.get((batch, ctx), 0.0), "timing": mode})
                if rank.rank == 0:
                    r = rows[-1]
                    print(f"dcp{d} {backend:3s} b{batch:<3d} ctx{ctx:<7d} attn "
                          f"{attn * 1e6:8.1f} comm {comm * 1e6:7.1f} merge {merge * 1e6:6.1f} "
                          f"total {total * 1e6:8.1f} | dcp1 {r['dcp1_s'] * 1e6:8.1f} us",
                          flush=True)
                del sb
                if rank.cuda:
                    torch.cuda.empty_cache()
    return rows


def worker(rank_id: int, world: int, port: int, cfg: dict, result_path: str) -> None:
    set_safe_env()
    cuda = cfg["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank_id)
    device = torch.device("cuda", rank_id) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank_id,
                            world_size=world, **({"device_id": device} if cuda else {}))
    try:
        rank = Rank(rank_id, world, device, cfg["repeats"])
        if cfg.get("mla_config"):
            rank.mla_config = tuple(cfg["mla_config"])
        rows: list[dict] = []
        dcp1: dict = {}
        if rank_id == 0:      # the single-GPU baseline: full context, no DCP
            for batch in cfg["batches"]:
                for ctx in cfg["contexts"]:
                    dcp1[(batch, ctx)] = attention_time(rank, batch, ctx)
                    rows.append({"kind": "dcp1", "backend": "", "dcp": 1, "batch_size": batch,
                                 "context_tokens": ctx, "q_heads": HEADS,
                                 "attn_s": dcp1[(batch, ctx)],
                                 "total_s": dcp1[(batch, ctx)], "dcp1_s": dcp1[(batch, ctx)],
                                 "timing": "graph" if cuda else "wall"})
            if cuda:
                torch.cuda.empty_cache()
        dist.barrier()
        checks = {}
        for d in cfg["dcps"]:
            group = dist.new_group(list(range(d)))
            if rank_id < d:
                checks[str(d)] = check(rank, group, d)
                rows += collectives(rank, group, d, cfg["message_sizes"])
                rows += step_rows(rank, group, d, cfg["batches"], cfg["contexts"], dcp1)
            dist.barrier()
        if rank_id == 0:
            name = rank.name
            for r in rows:
                r["gpu"] = name
            Path(result_path).write_text(json.dumps({
                "rows": rows, "checks": checks, "gpu": name, "world": world,
                "device": cfg["device"], "software": {"torch": torch.__version__,
                                                      "cuda": torch.version.cuda or "",
                                                      "nccl": _nccl_version() if cuda else ""},
                "memory_bytes": (torch.cuda.get_device_properties(device).total_memory
                                 if cuda else 0)}))
    finally:
        dist.destroy_process_group()


def _nccl_version() -> str:
    try:
        v = torch.cuda.nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except (AttributeError, RuntimeError):
        return ""


def run(world: int, *, device: str = "cuda", quick: bool = False, dcps: Sequence[int] | None = None,
        batches: Sequence[int] | None = None, contexts: Sequence[int] | None = None,
        message_sizes: Sequence[int] | None = None, repeats: int | None = None,
        mla_config: Sequence[int] | None = None, workdir: str | Path | None = None) -> dict:
    """Spawn ``world`` processes (one per GPU, or CPU processes with gloo) and measure."""
    import tempfile

    import torch.multiprocessing as mp

    if world < 2:
        raise ValueError("DCP needs at least 2 processes (GPUs)")
    set_safe_env()
    dcps = list(dcps or [d for d in (2, 4, 8, 16) if d <= world])
    if not dcps or max(dcps) > world or min(dcps) < 2:
        raise ValueError(f"dcp sizes {dcps} must lie in [2, {world}]")
    if message_sizes is None:
        message_sizes = MESSAGE_SIZES[::2] if quick else MESSAGE_SIZES
        if device == "cpu":
            message_sizes = [m for m in message_sizes if m <= 2**20]
    cfg = {"device": device, "dcps": dcps,
           "batches": list(batches or (QUICK_BATCHES if quick else BATCHES)),
           "contexts": list(contexts or (QUICK_CONTEXTS if quick else CONTEXTS)),
           "message_sizes": list(message_sizes),
           "repeats": repeats or (7 if quick else 15),
           "mla_config": list(mla_config) if mla_config else None}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        result = Path(tmp) / "dcp.json"
        mp.start_processes(worker, args=(world, free_port(), cfg, str(result)), nprocs=world,
                           start_method="spawn")
        data = json.loads(result.read_text())
    data["config"] = cfg
    return data
