"""EngineCostModel and select_terms: non-negative efficiencies that move only where the
held-out error says so."""

import math

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import check_estimator

from engine_advisor.model.fit.estimator import (
    COUNT_CEILING,
    PHYSICS_FLOOR,
    PRIOR,
    EngineCostModel,
    departure,
    interval_halfwidth,
    log_errors,
    select_terms,
)
from engine_advisor.model.fit.fitting import jackknife_coverage
from engine_advisor.model.physics.terms import TERMS

TRUE = {**PRIOR, "gemm": 1.4, "kv_read": 1.2, "step_fixed": 3e-3, "seq_fixed": 50e-6,
        "pf_gemm": 1.3, "pf_fixed": 4e-3}


def synthetic(coef: dict[str, float], n: int = 120, noise: float = 0.0, seed: int = 0):
    """Random non-negative term features (seconds / counts of plausible size) and their times."""
    rng = np.random.default_rng(seed)
    counts = {"pf_fixed": 10, "pf_batch": 1, "kernel_fixed": 600, "seq_fixed": 64, "step_fixed": 1,
              "dcp_fixed": 60}
    scale = np.array([counts.get(t, 1.0) for t in TERMS])
    X = rng.uniform(0.0, 1.0, (n, len(TERMS))) * scale
    X[:, TERMS.index("step_fixed")] = rng.integers(0, 2, n) * 100.0   # steps of a total
    X[:, TERMS.index("dcp_comm")] *= 0.01
    c = np.array([coef[t] for t in TERMS])
    y = X @ c
    return X, y * (1 + noise * rng.standard_normal(n))


def test_recovers_known_coefficients_within_2_percent():
    X, y = synthetic(TRUE)
    est = EngineCostModel(ridge=0.0, robust=False).fit(X, y)
    for t in ("gemm", "kv_read", "pf_gemm", "step_fixed", "seq_fixed"):
        assert est.coefficients_[t] == pytest.approx(TRUE[t], rel=0.02), t


def test_only_free_terms_move_and_the_rest_keep_their_prior():
    X, y = synthetic(TRUE)
    est = EngineCostModel(free=("gemm",)).fit(X, y)
    assert est.free_ == ["gemm"]
    for t in TERMS:
        if t != "gemm":
            assert est.coefficients_[t] == PRIOR[t], t


def test_count_terms_are_as_hard_to_move_as_physics_terms():
    """``departure`` counts a count term's move as a physics term's (summed |ln|), a count past
    its ceiling without end; so of two explanations of two points, the selection takes the
    smaller move, whichever kind of term it is."""
    X, y = synthetic(TRUE)
    est = EngineCostModel(free=["gemm", "step_fixed"]).fit(X, y)
    g, s = TERMS.index("gemm"), TERMS.index("step_fixed")
    est.coef_ = est.prior_.copy()
    assert departure(est) == 0.0
    est.coef_[g] = 10 * est.prior_[g]
    assert departure(est) == pytest.approx(math.log(10))
    est.coef_[g], est.coef_[s] = est.prior_[g], 10 * est.prior_[s]
    assert departure(est) == pytest.approx(math.log(10))
    est.coef_[g] = est.prior_[g] / 10
    assert departure(est) == pytest.approx(2 * math.log(10))
    est.coef_[s] = 2 * COUNT_CEILING["step_fixed"]
    assert departure(est) == math.inf

    # two points, each explained by gemm at 5 x or by step_fixed at 10 x its prior
    prior = np.array([PRIOR[t] for t in TERMS])
    X = np.zeros((2, len(TERMS)))
    X[:, TERMS.index("pf_batch")] = 1.0
    X[:, g] = [0.01, 0.02]
    X[:, s] = 4 * X[:, g] / (9 * PRIOR["step_fixed"])
    y = X @ prior + 4 * X[:, g]
    for count_first in (False, True):
        pool = ["step_fixed", "gemm"] if count_first else ["gemm", "step_fixed"]
        est, _, _ = select_terms(X, y, np.array([0, 1]), prior, pool, limit=1)
        assert est.free_ == ["gemm"]
        assert est.coefficients_["gemm"] == pytest.approx(5.0, rel=1e-3)


def test_selection_frees_the_terms_the_data_inform_and_no_others():
    """Times from the priors except two terms: selection frees those two (and the fit is
    better held out than the prior); a term with no signal is never freed."""
    coef = {**PRIOR, "kv_read": 1.6, "step_fixed": 2.5e-3}
    X, y = synthetic(coef, n=90, noise=0.01, seed=4)
    groups = np.arange(len(y)) // 3                # points of three observations each
    est, loo, prior_pred = select_terms(X, y, groups, PRIOR, TERMS)
    assert {"kv_read", "step_fixed"} <= set(est.free_)
    assert len(est.free_) <= 4
    assert np.mean(log_errors(loo, y)) < np.mean(log_errors(prior_pred, y)) / 3


def test_selection_keeps_the_prior_when_the_data_agree_with_it():
    """Times from the priors with 2 % noise: on most draws no term or one is freed (noise can
    look like a signal now and then), and held out the fit is never worse than the prior."""
    freed = []
    for seed in range(10):
        X, y = synthetic(PRIOR, n=60, noise=0.02, seed=seed)
        est, loo, prior_pred = select_terms(X, y, np.arange(60), PRIOR, TERMS)
        freed.append(len(est.free_))
        assert np.mean(log_errors(loo, y)) <= np.mean(log_errors(prior_pred, y)) * 1.001
    assert sum(n <= 1 for n in freed) >= 8, freed


def test_selection_never_frees_more_terms_than_half_the_points():
    X, y = synthetic(TRUE, n=8, seed=6)
    est, _, _ = select_terms(X, y, np.arange(8), PRIOR, TERMS)
    assert len(est.free_) <= 4


def test_closed_form_held_out_predictions_match_refitting_without_the_point():
    X, y = synthetic(TRUE, n=40, noise=0.02, seed=7)
    groups = np.arange(40) // 2
    free = ("gemm", "kv_read", "step_fixed")
    est = EngineCostModel(free=free, robust=False).fit(X, y)
    loo = est.loo_predictions(X, y, groups)
    for g in (0, 7, 19):
        keep = groups != g
        refit = EngineCostModel(free=free, robust=False).fit(X[keep], y[keep])
        np.testing.assert_allclose(loo[~keep], refit.predict(X[~keep]), rtol=1e-6)


def test_a_stalled_point_does_not_drag_the_fit():
    """Over eight datasets (one point of each 20 x too slow: a JIT compile inside one
    measurement) the robust fit's coefficients stay within 2 % of the clean fit's on average,
    a third of the plain fit's error, and the stalled point is down-weighted."""
    free = ("gemm", "kv_read", "step_fixed")
    errors = {"robust": [], "plain": []}
    for seed in range(8, 16):
        X, y = synthetic(TRUE, n=60, noise=0.01, seed=seed)
        y_bad = y.copy()
        y_bad[3] *= 20.0
        robust = EngineCostModel(free=free).fit(X, y_bad)
        plain = EngineCostModel(free=free, robust=False).fit(X, y_bad)
        clean = EngineCostModel(free=free).fit(X, y)
        for name, est in (("robust", robust), ("plain", plain)):
            errors[name].append(max(abs(est.coefficients_[t] / clean.coefficients_[t] - 1)
                                    for t in free))
        assert robust.weights_[3] < 0.5
    assert np.mean(errors["robust"]) < 0.02
    assert np.mean(errors["robust"]) < np.mean(errors["plain"]) / 3


def test_physics_coefficients_stay_above_their_floor():
    X, y = synthetic(TRUE)
    est = EngineCostModel(free=("gemm",)).fit(X, y * 0.3)
    assert est.coefficients_["gemm"] >= PHYSICS_FLOOR * PRIOR["gemm"] - 1e-12
    assert np.all(est.coef_ >= 0)


def test_collectives_are_held_at_the_silicon():
    rng = np.random.default_rng(3)
    n = 40
    X = np.zeros((n, len(TERMS)))
    X[:, TERMS.index("kv_read")] = rng.uniform(1, 5, n)
    X[:, TERMS.index("dcp_comm")] = np.where(np.arange(n) % 2, 0.5, 0.0)
    X[:, TERMS.index("dcp_fixed")] = np.where(np.arange(n) % 2, 1000.0, 0.0)
    y = X[:, TERMS.index("kv_read")] + np.where(np.arange(n) % 2, 0.2, 0.0)
    est, _, _ = select_terms(X, y, np.arange(n), PRIOR, TERMS)
    assert est.coefficients_["dcp_comm"] == PRIOR["dcp_comm"]
    assert "dcp_fixed" in est.free_


def test_held_out_intervals_cover_ninety_percent_of_new_points():
    X, y = synthetic(TRUE, n=200, noise=0.05, seed=9)
    est, loo, _ = select_terms(X[:150], y[:150], np.arange(150), PRIOR, TERMS)
    w = interval_halfwidth(log_errors(loo, y[:150]))
    new = log_errors(est.predict(X[150:]), y[150:])
    assert np.mean(new <= w) >= 0.85
    assert jackknife_coverage(log_errors(loo, y[:150])) >= 0.88


def test_interval_halfwidth_is_a_conformal_quantile():
    err = np.arange(1, 20) / 100.0                 # 19 errors: the 18th smallest covers 90 %
    assert interval_halfwidth(err) == pytest.approx(0.18)
    assert interval_halfwidth(np.array([0.1, 0.2])) == pytest.approx(0.3)
    assert interval_halfwidth(np.array([])) is None


def test_relative_noise_comes_from_the_held_out_halfwidth():
    X, y = synthetic(TRUE, noise=0.01)
    est = EngineCostModel(free=("gemm",)).fit(X, y)
    est.interval_halfwidth_ = math.log(1.2)
    assert est.relative_noise_ == pytest.approx(0.2 / 1.645)
    pred, lo, hi = est.predict_interval(X[:3])
    np.testing.assert_allclose(hi, pred * 1.2)


def test_fit_is_deterministic_and_clone_refits_identically():
    X, y = synthetic(TRUE, noise=0.01)
    a = EngineCostModel(free=("gemm", "kv_read")).fit(X, y)
    b = clone(a).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_bad_fit_inputs_are_refused():
    X, y = synthetic(TRUE)
    with pytest.raises(ValueError, match="positive"):
        EngineCostModel().fit(X, -y)
    with pytest.raises(ValueError, match=f"{len(TERMS)} columns"):
        EngineCostModel().fit(X[:, :3], y)
    with pytest.raises(ValueError, match="prior: unknown"):
        EngineCostModel(prior={"warp_drive": 1.0}).fit(X, y)
    with pytest.raises(ValueError, match="free: unknown"):
        EngineCostModel(free=("warp_drive",)).fit(X, y)


def test_sklearn_estimator_checks():
    """All generic checks pass except those feeding random feature counts: the columns are
    the named physical terms, and other shapes are refused with a clear error."""
    results = check_estimator(EngineCostModel(), on_fail=None, on_skip=None)
    unexpected = [r["check_name"] for r in results if r["status"] == "failed"
                  and f"must have {len(TERMS)} columns" not in str(r["exception"])]
    assert unexpected == []
    assert sum(r["status"] == "passed" for r in results) >= 20
