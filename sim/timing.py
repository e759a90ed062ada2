"""Step durations from the cost model: prefill of a batch and one decode step of the running set.

The same physical terms (``engine_advisor.model.physics.terms``) and fitted engine coefficients the
recommender uses, a decode step reading and writing each sequence's linear-attention state at the
engine's own dtypes (``engine_advisor.model.physics.memory.state_layout``: vLLM keeps Qwen3-Next's
GDN state in bf16, SGLang in fp32); the scheduler asks once per step, never per token or per
request.
"""

from __future__ import annotations

from engine_advisor.model import engines
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.hardware.gpus import GpuSpec
from engine_advisor.model.hardware.silicon import silicon_for
from engine_advisor.model.physics.memory import state_layout
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.physics.terms import N_PREFILL, Hardware, decode_terms, prefill_terms
from engine_advisor.model.predict.predictor import predictor_for


class StepTimer:
    """Unscaled seconds of prefill and decode steps of one engine configuration."""

    def __init__(self, model: CostModel, engine: str, gpu: GpuSpec, shape: ModelShape,
                 tp: int, dcp: int = 1):
        # an engine the model has no data for (TensorRT-LLM until calibrated) steps at the
        # physics priors, as the recommender predicts it (``Predictor.coefficients``)
        self.priors_only = engine not in model.engine_names
        self.model = model
        self.coef = predictor_for(model).coefficients(engine, gpu.name, shape, tp)[0]
        self.coef_prefill = self.coef[:N_PREFILL].tolist()
        self.coef_decode = self.coef[N_PREFILL:].tolist()
        self.shape, self.dcp = shape, float(dcp)
        # the largest prefill pass this engine replays as a CUDA graph for this model
        self.graph_tokens = float(engines.get(engine).graphed_prefill_tokens(shape.attention))
        self.hw = Hardware(silicon_for(gpu).for_engine(engine), tp)
        # one sequence's state per GPU as this engine holds it (what the recommender's rows
        # carry: engine_advisor.model.physics.features.static_rows)
        self.state_bytes = float(state_layout(engine, shape, tp, gpu.name,
                                              gpu.memory_bytes).state_bytes)
        self.prefill_s(1, 1.0)   # the compiled formulas, before the first step is timed
        self.step_s(1, 1.0)

    def prefill_s(self, batch: int, context: float, share: float = 0.0) -> float:
        """Prefill (TTFT) of ``batch`` sequences of ``context`` prompt tokens each."""
        f = prefill_terms(self.shape, self.hw, float(max(batch, 1)), float(max(context, 1.0)),
                          float(share), graph_tokens=self.graph_tokens)
        return float(sum(t * c for t, c in zip(f, self.coef_prefill, strict=True)))

    def step_s(self, batch: int, context: float) -> float:
        """One decode step of ``batch`` running sequences at mean context ``context``."""
        f = decode_terms(self.shape, self.hw, float(max(batch, 1)), float(max(context, 1.0)),
                         self.dcp, self.state_bytes)
        return float(sum(t * c for t, c in zip(f, self.coef_decode, strict=True)))
