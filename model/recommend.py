"""A recommendation, one stage after the other: every feasible (engine, dcp) of a workload
ranked by predicted total time, the fastest that may be recommended, and why.

1. hardware: the GPU's silicon (``model.hardware.silicon``);
2. physics: the served model's constants on it at the TP size (``model.physics.terms``);
3. fitted efficiencies: read, not run: the ``CostModel`` was fitted by ``model.fit``;
4. predictions: the configurations the workload allows, each one's prediction and whether
   it may be recommended (``model.predict.query``);
5. decision: the choice, its rival, the confidence, the crossover (``model.decision.choose``);
6. presentation: reasons, launch command, the ``Recommendation`` (``model.presentation``).

Each stage hands its results to the next and is not entered again (``tests/model/
test_walk.py`` traces it).
"""

from __future__ import annotations

from model.decision.choose import decide
from model.errors import NoEligibleConfiguration
from model.fit.costmodel import CostModel
from model.hardware.silicon import silicon_for
from model.physics.terms import physics_for
from model.predict.predictor import predictor_for
from model.predict.query import candidates, evaluate, excluded_field
from model.presentation.answer import answer
from model.schemas import Recommendation
from model.workload import Workload

__all__ = ["recommend", "warm_up"]


def recommend(model: CostModel, w: Workload, version: str) -> Recommendation:
    # 1. hardware
    si = silicon_for(w.gpu_spec())
    gpu, provenance = si.gpu.name, si.provenance
    # 2. physics
    shape = w.model_shape()
    ph = physics_for(shape, si, w.num_gpus)
    ph.collectives(w.num_gpus)           # every DCP size of the TP group
    # 3-4. the fitted model's predictions of every allowed configuration
    configs, excluded = candidates(w, shape)
    if not configs:
        exc = NoEligibleConfiguration("every configuration is excluded: "
                                      + "; ".join(x.describe() for x in excluded))
        exc.field = excluded_field(w, excluded)
        raise exc
    pred = predictor_for(model)
    evals = evaluate(model, w, shape, configs, si, ph)
    memory = {e: pred.memory(e, gpu) for e in dict.fromkeys(c.engine for c in configs)}
    # 5. decision
    d = decide(pred, w, shape, si, evals, excluded)
    # 6. presentation
    return answer(w, shape, gpu, d, memory[d.best.config.engine], provenance, version)


def warm_up(model: CostModel) -> None:
    """One recommendation of the seed's workload and one decode and prefill of its terms, so
    that the compiled formulas (``model.formulas``: compiled on a fresh checkout, loaded from
    numba's cache after) are ready before the first query is timed or served."""
    w = Workload(context_tokens=65_536, output_tokens=256, batch_size=8, preset="kimi-k3",
                 allow_extrapolation=True)
    try:
        recommend(model, w, "warm-up")
    except NoEligibleConfiguration:    # a model without these engines: compiled all the same
        pass
    ph = physics_for(w.model_shape(), silicon_for(w.gpu_spec()), w.num_gpus)
    ph.decode(1.0, 1.0, 1.0)             # the simulator's step timer calls these one by one
    ph.prefill(1.0, 1.0)
