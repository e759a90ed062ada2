"""The plain PyTorch MLA decode attention: the reference the Triton kernel is checked against,
and the attention of the CPU (gloo) path of ``calibrate dcp``. Needs no Triton."""

from __future__ import annotations

import torch

D_LAT = 512     # latent (value) dims of the MLA KV
D_ROPE = 64     # rotary key dims after them: 576 per token


def mla_decode_reference(q: torch.Tensor, kv: torch.Tensor,
                         sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 MLA decode: ``q`` (B, H, 576) over ``kv`` (B, N, 576); values are the first 512
    latent dims. Returns the output (B, H, 512) fp32 and the natural-log LSE (B, H)."""
    qf, kf = q.float(), kv.float()
    s = torch.einsum("bhd,bnd->bhn", qf, kf) * sm_scale
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    return torch.einsum("bhn,bnd->bhd", p, kf[..., :D_LAT]).contiguous(), lse.contiguous()
