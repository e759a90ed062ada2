"""A recommendation, one stage after the other: every feasible (engine, dcp) of a workload
ranked by predicted total time, the fastest that may be recommended, and why.

1. hardware: the GPU's silicon (``engine_advisor.model.hardware.silicon``);
2. physics: the served model's constants on it at the TP size
   (``engine_advisor.model.physics.terms``);
3. fitted efficiencies: read, not run: the ``CostModel`` was fitted by ``engine_advisor.model.fit``;
4. predictions: the configurations the workload allows, each one's prediction and whether
   it may be recommended (``engine_advisor.model.predict.query``). What stages 1-4 need that the
   workload's sizes do not change is gathered once per workload without its sizes
   (``engine_advisor.model.queries.query_for``): a recommendation of a query seen before starts
   here;
5. decision: the choice, its rival, the confidence, the crossover
   (``engine_advisor.model.decision.choose``);
6. presentation: reasons, launch command, the ``Recommendation``
   (``engine_advisor.model.presentation``).

Each stage hands its results to the next and is not entered again (``tests/model/
test_walk.py`` traces it).
"""

from __future__ import annotations

from engine_advisor.model.decision.choose import decide
from engine_advisor.model.errors import NoEligibleConfiguration
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.hardware.silicon import silicon_for
from engine_advisor.model.physics.terms import physics_for
from engine_advisor.model.predict.query import excluded_field
from engine_advisor.model.presentation.answer import answer
from engine_advisor.model.queries import query_for
from engine_advisor.model.schemas import Recommendation
from engine_advisor.model.workload import Workload

__all__ = ["recommend", "warm_up"]


def recommend(model: CostModel, w: Workload, version: str) -> Recommendation:
    # 1-4. the query: hardware, physics, fitted efficiencies and the allowed configurations
    # (gathered once per workload without its sizes), then every configuration's prediction
    q = query_for(model, w)
    if not q.configs:
        exc = NoEligibleConfiguration("every configuration is excluded: "
                                      + "; ".join(x.describe() for x in q.excluded))
        exc.field = excluded_field(w, q.excluded)
        raise exc
    evals = q.evaluate(w)
    # 5. decision
    d = decide(q, w, evals)
    # 6. presentation
    return answer(w, q.shape, q.gpu, d, q.memory[d.best.config.engine],
                  q.provenance[d.best.config.engine], version, q.moe_notes)


def warm_up(model: CostModel) -> None:
    """One recommendation of the seed's workload and one decode and prefill of its terms, so that
    the compiled formulas (``engine_advisor.model.formulas``: compiled on a fresh checkout, loaded
    from numba's cache after) are ready before the first query is timed or served."""
    w = Workload(context_tokens=65_536, output_tokens=256, batch_size=8, preset="kimi-k3",
                 allow_extrapolation=True)
    try:
        recommend(model, w, "warm-up")
    except NoEligibleConfiguration:    # a model without these engines: compiled all the same
        pass
    ph = physics_for(w.model_shape(), silicon_for(w.gpu_spec()), w.num_gpus)
    ph.decode(1.0, 1.0, 1.0)             # the simulator's step timer calls these one by one
    ph.prefill(1.0, 1.0)
