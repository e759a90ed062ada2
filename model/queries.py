"""A workload's query: what its predictions need that its sizes (context, output, batch) do
not change, gathered once per workload without its sizes: the first stages of a
recommendation (model/recommend.py), hardware -> physics -> the configurations and their
facts (``engine_advisor.model.predict.query.Query``). A query seen before starts at the predictions.

Queries are memoised with the model (``CostModel.__getstate__`` leaves them out), per
profiles directory and generation: reloaded profiles are new silicon.
"""

from __future__ import annotations

from os import environ

from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.hardware.profiles import GENERATION, PROFILES_ENV
from engine_advisor.model.hardware.silicon import silicon_for
from engine_advisor.model.physics.terms import physics_for
from engine_advisor.model.predict.query import Evaluated, Query
from engine_advisor.model.workload import Config, Workload

QUERY_CACHE_SIZE = 1024

__all__ = ["evaluate", "query_for"]


def query_for(model: CostModel, w: Workload, configs: list[Config] | None = None) -> Query:
    """The ``Query`` of ``w`` without its sizes, of ``configs`` (every one ``w`` allows when
    None; given, they are evaluated as they are, none excluded)."""
    cache = model.__dict__.get("_queries")
    if cache is None:
        cache = model.__dict__["_queries"] = {}
    chosen = None if configs is None else tuple(configs)
    key = (w.query_key(), chosen, environ.get(PROFILES_ENV), GENERATION[0])
    q = cache.get(key)
    if q is None:
        if len(cache) >= QUERY_CACHE_SIZE:
            cache.clear()
        si = silicon_for(w.gpu_spec())                   # hardware
        shape = w.model_shape()                          # physics
        ph = physics_for(shape, si, w.num_gpus)
        ph.collectives(w.num_gpus)                       # every DCP size of the TP group
        q = cache[key] = Query(model, w, si, shape, ph, chosen)
    return q


def evaluate(model: CostModel, w: Workload, configs: list[Config] | None = None
             ) -> list[Evaluated]:
    """Every configuration's prediction at ``w``'s sizes (``Query.evaluate``), of ``configs``
    or of every one ``w`` allows."""
    return query_for(model, w, configs).evaluate(w)
