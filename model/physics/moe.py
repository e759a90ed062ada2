"""Which fused-MoE prefill kernel an engine runs a served model's routed experts on
(``engine_advisor.model.engines.base.Engine.moe_kernel``): its time over the kernel the engine's
``pf_moe`` prior was measured on, for the same physics: a factor of
``engine_advisor.model.physics.scale``, so that one coefficient per engine holds across models
whose experts run on different kernels.
"""

from __future__ import annotations

from functools import lru_cache

from engine_advisor.model import engines
from engine_advisor.model.engines.base import REFERENCE_MOE, MoeKernel, MoeShape
from engine_advisor.model.hardware.gpus import gpu_family
from engine_advisor.model.physics.shape import ModelShape


def moe_shape(shape: ModelShape, gpu: str, tp: int) -> MoeShape:
    return MoeShape(n_experts=shape.n_experts, n_shared=shape.n_shared_experts,
                    intermediate=shape.expert_intermediate // max(tp, 1),
                    expert_dtype=shape.expert_dtype, gpu=gpu, gpu_family=gpu_family(gpu))


def moe_kernel(engine: str, shape: ModelShape, gpu: str, tp: int) -> MoeKernel:
    """``engine``'s fused-MoE prefill kernel for ``shape``'s experts on ``tp`` GPUs of type
    ``gpu`` (the reference kernel for a dense model or an engine that names none)."""
    known = engines.REGISTRY.get(engine)
    if known is None or known.moe_kernel is None or shape.n_experts <= 0:
        return REFERENCE_MOE
    return _kernel(known.moe_kernel, moe_shape(shape, gpu, tp))


@lru_cache(maxsize=1024)
def _kernel(pick, m: MoeShape) -> MoeKernel:
    return pick(m)
