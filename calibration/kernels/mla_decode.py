"""Split-KV (flash-decoding) MLA decode attention in Triton (its PyTorch reference, in
mla_torch.py, is re-exported here).

The MLA decode shape: every sequence has one latent KV head of ``D_LAT + D_ROPE`` (512 + 64)
values per token; ``H`` query heads (64-128) attend over it with the full 576-wide key and take
the first 512 values as the value vector. PyTorch has no fused kernel for this shape, so the
calibration times this one.

Two launches:

1. ``_mla_split``: grid (head blocks, splits, batch). Each program owns ``BLOCK_H`` query heads of
   one sequence and one contiguous chunk of its tokens; it streams the chunk in ``BLOCK_N`` tiles
   with an online softmax (base-2 exponentials) and writes the chunk's normalised partial output
   plus its log-sum-exp (base 2). ``chunk`` is a multiple of ``BLOCK_N`` and every chunk holds at
   least one token, so masked tiles only occur at the end of the last chunk.
2. ``_mla_combine``: grid (heads, batch). Merges the chunk partials of one head into the output
   and the natural-log LSE, which DCP needs to merge partials across ranks.

Head blocks are the fastest grid axis so the programs that share a KV tile run side by side and
the second read of the tile hits L2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from engine_advisor.calibration.kernels.mla_torch import (
    D_LAT,
    D_ROPE,
    mla_decode_reference,  # noqa: F401 (re-export)
)

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _mla_split(Q, KV, O_part, L_part, sm_scale_log2, n_ctx, chunk,
               stride_qb, stride_qh, stride_kb, stride_kn,
               stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
               H: tl.constexpr, D_LAT: tl.constexpr, D_ROPE: tl.constexpr,
               BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    hb = tl.program_id(0)
    sp = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    offs_d = tl.arange(0, D_LAT)
    offs_r = tl.arange(0, D_ROPE)
    q_base = Q + b * stride_qb + offs_h[:, None] * stride_qh
    q_nope = tl.load(q_base + offs_d[None, :], mask=mask_h[:, None], other=0.0)
    q_pe = tl.load(q_base + D_LAT + offs_r[None, :], mask=mask_h[:, None], other=0.0)
    start = sp * chunk
    end = tl.minimum(start + chunk, n_ctx)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D_LAT], dtype=tl.float32)
    kv_base = KV + b * stride_kb
    for i in range(0, chunk, BLOCK_N):
        offs_n = start + i + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        rows = kv_base + offs_n[:, None].to(tl.int64) * stride_kn
        k = tl.load(rows + offs_d[None, :], mask=mask_n[:, None], other=0.0).to(q_nope.dtype)
        k_pe = tl.load(rows + D_LAT + offs_r[None, :], mask=mask_n[:, None],
                       other=0.0).to(q_pe.dtype)
        s = tl.dot(q_nope, tl.trans(k)) + tl.dot(q_pe, tl.trans(k_pe))
        s = s * sm_scale_log2
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), k)
        m_i = m_new
    o = acc / l_i[:, None]
    lse = m_i + tl.log2(l_i)
    o_ptrs = (O_part + b * stride_ob + offs_h[:, None] * stride_oh + sp * stride_os
              + offs_d[None, :])
    tl.store(o_ptrs, o, mask=mask_h[:, None])
    tl.store(L_part + b * stride_lb + offs_h * stride_lh + sp, lse, mask=mask_h)


@triton.jit
def _mla_combine(O_part, L_part, Out, Lse, n_split,
                 stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
                 stride_outb, stride_outh, stride_lseb,
                 D_LAT: tl.constexpr, BLOCK_S: tl.constexpr):
    h = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < n_split
    lse = tl.load(L_part + b * stride_lb + h * stride_lh + offs_s, mask=mask_s,
                  other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp2(lse - m)
    w = tl.where(mask_s, w, 0.0)
    denom = tl.sum(w, 0)
    offs_d = tl.arange(0, D_LAT)
    parts = tl.load(O_part + b * stride_ob + h * stride_oh + offs_s[:, None] * stride_os
                    + offs_d[None, :], mask=mask_s[:, None], other=0.0)
    o = tl.sum(parts * w[:, None], 0) / denom
    tl.store(Out + b * stride_outb + h * stride_outh + offs_d, o.to(Out.dtype.element_ty))
    tl.store(Lse + b * stride_lseb + h, (m + tl.log2(denom)) * 0.6931471805599453)


SM_FLOPS = 1.5e12          # rough bf16 FLOP/s of one SM in this kernel (sets the split trade-off)
PARTIAL_BPS = 3e12         # bytes/s at which partials are written and re-read


def split_count(batch: int, n_hb: int, heads: int, n_ctx: int, block_n: int, block_h: int,
                slots: int) -> int:
    """Chunks per sequence minimising a rough time model: waves of programs (``slots`` run at
    once) times the chunk's work, plus writing and re-reading the fp32 partials of each chunk.
    More chunks fill the GPU and even out the last wave; each costs partial traffic."""
    max_split = max(1, triton.cdiv(n_ctx, block_n))
    tok_s = block_h * 2.0 * (D_LAT + D_ROPE + D_LAT) / SM_FLOPS
    best, best_t = 1, math.inf
    for s in range(1, min(max_split, 8 * slots) + 1):
        chunk = triton.cdiv(triton.cdiv(n_ctx, s), block_n) * block_n
        waves = math.ceil(batch * n_hb * triton.cdiv(n_ctx, chunk) / slots)
        t = waves * (chunk * tok_s + 1e-6) + 2 * s * batch * heads * (D_LAT + 1) * 4 / PARTIAL_BPS
        if t < best_t - 1e-12:
            best, best_t = s, t
    return best


class MlaPlan:
    """Launch parameters and scratch buffers for one (batch, heads, context) shape."""

    def __init__(self, batch: int, heads: int, n_ctx: int, device, *, block_h: int = 32,
                 block_n: int = 64, num_warps: int = 4, num_stages: int = 2,
                 target_programs: int | None = None):
        if n_ctx <= 0 or batch <= 0 or heads <= 0:
            raise ValueError("batch, heads and n_ctx must be positive")
        self.batch, self.heads, self.n_ctx = batch, heads, n_ctx
        self.block_h = min(block_h, max(16, triton.next_power_of_2(heads)))
        self.block_n, self.num_warps, self.num_stages = block_n, num_warps, num_stages
        n_hb = triton.cdiv(heads, self.block_h)
        if target_programs is None:
            sms = (torch.cuda.get_device_properties(device).multi_processor_count
                   if torch.device(device).type == "cuda" else 4)
            target_programs = 2 * sms
        n_split = split_count(batch, n_hb, heads, n_ctx, block_n, self.block_h,
                              max(1, target_programs // 2))
        self.chunk = triton.cdiv(triton.cdiv(n_ctx, n_split), block_n) * block_n
        self.n_split = triton.cdiv(n_ctx, self.chunk)  # every split is non-empty
        self.grid = (n_hb, self.n_split, batch)
        self.o_part = torch.empty(batch, heads, self.n_split, D_LAT, device=device,
                                  dtype=torch.float32)
        self.l_part = torch.empty(batch, heads, self.n_split, device=device, dtype=torch.float32)


def mla_decode(q: torch.Tensor, kv: torch.Tensor, sm_scale: float, plan: MlaPlan | None = None,
               out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
               **plan_kw) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention of ``q`` (B, H, 576) over the latent cache ``kv`` (B, N, 576).

    Returns the output (B, H, 512) in ``q``'s dtype and the natural-log LSE (B, H) in fp32.
    ``kv`` may be bf16 or fp8 (upcast to ``q``'s dtype per tile).
    """
    B, H, D = q.shape
    if D != D_LAT + D_ROPE or kv.shape[0] != B or kv.shape[2] != D:
        raise ValueError(f"shapes: q {tuple(q.shape)}, kv {tuple(kv.shape)}; want (B,H,576), "
                         "(B,N,576)")
    if q.stride(2) != 1 or kv.stride(2) != 1:
        raise ValueError("the last dimension of q and kv must be contiguous")
    if plan is None:
        plan = MlaPlan(B, H, kv.shape[1], q.device, **plan_kw)
    if out is None:
        out = torch.empty(B, H, D_LAT, device=q.device, dtype=q.dtype)
    if lse is None:
        lse = torch.empty(B, H, device=q.device, dtype=torch.float32)
    op, lp = plan.o_part, plan.l_part
    _mla_split[plan.grid](
        q, kv, op, lp, sm_scale * LOG2E, plan.n_ctx, plan.chunk,
        q.stride(0), q.stride(1), kv.stride(0), kv.stride(1),
        op.stride(0), op.stride(1), op.stride(2), lp.stride(0), lp.stride(1),
        H=H, D_LAT=D_LAT, D_ROPE=D_ROPE, BLOCK_H=plan.block_h, BLOCK_N=plan.block_n,
        num_warps=plan.num_warps, num_stages=plan.num_stages)
    _mla_combine[(H, B)](
        op, lp, out, lse, plan.n_split,
        op.stride(0), op.stride(1), op.stride(2), lp.stride(0), lp.stride(1),
        out.stride(0), out.stride(1), lse.stride(0),
        D_LAT=D_LAT, BLOCK_S=max(2, triton.next_power_of_2(plan.n_split)), num_warps=4)
    return out, lse
