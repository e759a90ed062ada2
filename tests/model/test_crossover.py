"""Crossovers are real changes of the best: configurations that trade places within the
engines' tie margin make none, and a change is placed where the two curves cross."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine_advisor.model.decision.crossover import (
    CROSSOVER_GRID,
    TIE,
    crossovers,
    engine_envelopes,
)
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.predict.query import candidates, total_curves
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload

GRID = np.geomspace(1024, 1 << 20, 41)


def test_rows_within_the_margin_make_no_crossover():
    a = GRID * 1e-3
    b = a * (1.0 + 0.02 * np.sin(4 * np.log(GRID)))  # 2 % either side of a, crossing often
    totals = np.array([a, b])
    assert len(crossovers(GRID, totals, margin=0.0)) >= 4
    assert crossovers(GRID, totals) == []


def test_a_row_that_pulls_ahead_crosses_where_the_curves_cross():
    a = GRID * 1e-3
    b = a * (GRID / 65_536) ** -0.3          # equal at 64K, faster above it
    (x, before, after), = crossovers(GRID, np.array([a, b]))
    assert (before, after) == (0, 1)
    assert x == pytest.approx(65_536, rel=0.01)


def test_a_leader_that_stops_fitting_hands_over_halfway_between_grid_points():
    a = GRID * 1e-3
    b = a * 1.5
    a = np.where(GRID > 200_000, np.nan, a)      # the leader's KV runs out above 200K
    (x, before, after), = crossovers(GRID, np.array([a, b]))
    i = int(np.searchsorted(GRID, 200_000))
    assert (before, after) == (0, 1)
    assert x == pytest.approx(math.sqrt(GRID[i - 1] * GRID[i]), rel=0.001)


@pytest.mark.parametrize("batch,output", [(512, 256), (64, 2048), (8, 4096)])
def test_every_engine_crossover_of_kimi_k3_is_a_lead_beyond_the_margin(batch, output):
    """The issue's workloads on 8 x B300 (all configurations eligible): after each reported
    change of the best engine, the new engine is ahead of the old by more than TIE somewhere
    before the next change, and never behind it by more than TIE."""
    m = default_model()
    w = Workload(context_tokens=131_072, output_tokens=output, batch_size=batch,
                 preset="kimi-k3", gpu="B300", num_gpus=8, allow_extrapolation=True)
    configs, _ = candidates(w, w.model_shape())
    totals = total_curves(m, w, w.model_shape(), configs, CROSSOVER_GRID)
    names, env, _ = engine_envelopes(totals, [c.engine for c in configs])
    found = crossovers(CROSSOVER_GRID, env)
    bounds = [x for x, _, _ in found] + [CROSSOVER_GRID[-1] * 2]
    for (x, old, new), end in zip(found, bounds[1:], strict=True):
        reign = (CROSSOVER_GRID >= x) & (CROSSOVER_GRID < end)
        ahead = env[old, reign] / env[new, reign]
        assert np.nanmax(ahead) > 1.0 + TIE, (names[old], names[new], x)
        assert np.nanmin(ahead) >= 1.0 / (1.0 + TIE) - 1e-9, (names[old], names[new], x)


def test_the_recommendations_crossover_is_a_change_of_engine():
    m = default_model()
    w = Workload(context_tokens=131_072, output_tokens=2048, batch_size=64, preset="kimi-k3",
                 gpu="B300", num_gpus=8, allow_extrapolation=True)
    assert recommend(m, w, "t").crossover_context_tokens is not None
    one = w.model_copy(update={"engines": ["sglang"]})
    assert recommend(m, one, "t").crossover_context_tokens is None
