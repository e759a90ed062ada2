"""What one engine multiplies some cost terms' features by for a served model: the terms whose
physics is shared by every engine but whose count or kernel is the engine's own.

- ``pf_moe``: the engine's fused-MoE prefill kernel for the model's experts, over the kernel its
  prior was measured on (``engine_advisor.model.physics.moe``);
- ``kernel_fixed``: the kernels the engine launches in one decode step of the model
  (``engine_advisor.model.physics.launches``); the term's feature is one per step.

The fits multiply each row's features by them (``engine_advisor.model.fit.fitting.observations``)
and the predictions the engine's coefficients (``engine_advisor.model.predict.predictor``), so that
one coefficient per engine holds across models: seconds per kernel launched, a fused-MoE kernel's
efficiency at the reference configuration.
"""

from __future__ import annotations

from engine_advisor.model.physics.launches import decode_launches
from engine_advisor.model.physics.moe import moe_kernel
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.physics.terms import TERMS

PF_MOE = TERMS.index("pf_moe")
KERNEL_FIXED = TERMS.index("kernel_fixed")


def term_scale(engine: str, shape: ModelShape, gpu: str, tp: int) -> tuple[tuple[int, float], ...]:
    """(term index, factor) of each term ``engine`` scales for ``shape`` on ``tp`` GPUs of type
    ``gpu`` (factors of 1 left out)."""
    out = [(KERNEL_FIXED, decode_launches(engine, shape))]
    kernel = moe_kernel(engine, shape, gpu, tp).factor
    if kernel != 1.0:
        out.append((PF_MOE, kernel))
    return tuple(out)
