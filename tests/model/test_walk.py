"""A recommendation walks model/'s pipeline once: hardware -> physics -> predictions -> decision ->
presentation, each stage handing its results to the next (model/recommend.py). Hardware, physics and
what the predictions need that the workload's sizes do not change are gathered once per workload
without its sizes (``engine_advisor.model.queries``): a served recommendation of a query seen before
starts at the predictions.

The walk is traced with ``sys.setprofile``: every Python call into a stage folder's module is a
visit to that stage. The fitted efficiencies (``engine_advisor.model.fit``) are data the predictor
reads: a served recommendation does not run fit code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload

MODEL_DIR = Path(__file__).resolve().parents[2] / "model"
PIPELINE = ("hardware", "physics", "fit", "predict", "decision", "presentation")
WORKLOADS = [
    dict(context_tokens=131_072, output_tokens=1024, batch_size=16, preset="kimi-k3"),
    dict(context_tokens=8192, output_tokens=256, batch_size=64, preset="llama-3.1-70b",
         gpu="H200", num_gpus=8),
    dict(context_tokens=32_768, output_tokens=512, batch_size=4, preset="deepseek-v2-lite",
         gpu="H200", num_gpus=1, requirements={"prefix_reuse_share": 0.5}),
]


def stage_walk(fn) -> list[str]:
    """The stages ``fn()`` enters, in order, consecutive calls within one stage merged."""
    walk: list[str] = []

    def profile(frame, event, arg):  # noqa: ARG001
        if event != "call":
            return
        try:
            rel = Path(frame.f_code.co_filename).resolve().relative_to(MODEL_DIR)
        except ValueError:
            return
        stage = rel.parts[0]
        if stage in PIPELINE and (not walk or walk[-1] != stage):
            walk.append(stage)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return walk


@pytest.mark.parametrize("spec", WORKLOADS, ids=lambda s: s["preset"])
def test_a_served_recommendation_visits_each_stage_once_in_order(spec):
    model = default_model()
    w = Workload(**spec)
    recommend(model, w, "v")                          # the caches a server holds
    walk = stage_walk(lambda: recommend(model, w, "v"))
    assert walk == ["predict", "decision", "presentation"]      # the query is held
    # another context of the same query: the same walk, with nothing gathered again
    other = w.model_copy(update={"context_tokens": w.context_tokens * 2 + 1})
    assert stage_walk(lambda: recommend(model, other, "v")) == walk


def test_a_first_recommendation_only_calls_down_the_pipeline():
    """On cold caches a stage also calls the stages below it as a library (the physics reads
    the silicon's tables; the predictor's first query of a GPU asks for memory fractions and
    calibrated ranges): the walk never climbs back to a stage it has left for a later one."""
    from engine_advisor.model.fit.costmodel import CostModel

    model = CostModel(engines=dict(default_model().engines), ranges=default_model().ranges,
                      memory=default_model().memory)
    w = Workload(context_tokens=100_000, output_tokens=512, batch_size=5,
                 preset="llama-3.1-70b")
    walk = stage_walk(lambda: recommend(model, w, "v"))
    assert walk[0] == "hardware" and walk[-1] == "presentation"
    order = [s for i, s in enumerate(walk) if PIPELINE.index(s) > max(
        [PIPELINE.index(x) for x in walk[:i]], default=-1)]
    assert order == ["hardware", "physics", "predict", "decision", "presentation"]
