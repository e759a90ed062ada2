"""EngineCostModel: non-negative efficiencies over the physical terms of model.terms."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import check_estimator

from model.estimator import PRIOR, EngineCostModel
from model.terms import TERMS

TRUE = {**PRIOR, "gemm": 1.4, "kv_read": 1.2, "step_fixed": 3e-3, "seq_fixed": 50e-6,
        "pf_gemm": 1.3, "pf_fixed": 4e-3}


def synthetic(coef: dict[str, float], n: int = 120, noise: float = 0.0, seed: int = 0):
    """Random non-negative term features (seconds / counts of plausible size) and their times."""
    rng = np.random.default_rng(seed)
    counts = {"pf_fixed": 10, "pf_batch": 1, "layer_fixed": 60, "seq_fixed": 64, "step_fixed": 1}
    scale = np.array([counts.get(t, 1.0) for t in TERMS])
    X = rng.uniform(0.0, 1.0, (n, len(TERMS))) * scale
    X[:, TERMS.index("step_fixed")] = rng.integers(0, 2, n) * 100.0   # steps of a total
    X[:, TERMS.index("dcp_comm")] *= 0.01
    c = np.array([coef[t] for t in TERMS])
    y = X @ c
    return X, y * (1 + noise * rng.standard_normal(n))


def test_recovers_known_coefficients_within_2_percent():
    X, y = synthetic(TRUE)
    est = EngineCostModel(prior_scale=0.0, n_bootstrap=0).fit(X, y)
    for t in ("gemm", "kv_read", "pf_gemm", "step_fixed", "seq_fixed"):
        assert est.coefficients_[t] == pytest.approx(TRUE[t], rel=0.02), t


def test_noisy_data_intervals_cover_most_points():
    X, y = synthetic(TRUE, noise=0.03, seed=1)
    est = EngineCostModel(n_bootstrap=40).fit(X, y)
    pred, lo, hi = est.predict_interval(X)
    assert np.mean((y >= lo) & (y <= hi)) > 0.8
    assert np.all(lo <= pred) and np.all(pred <= hi)


def test_coefficients_are_non_negative_even_for_adversarial_data():
    X, y = synthetic(TRUE)
    y_bad = y * np.where(np.arange(len(y)) % 2, 0.1, 3.0)  # no non-negative fit explains this
    est = EngineCostModel(n_bootstrap=5).fit(X, y_bad)
    assert np.all(est.coef_ >= 0)


def test_prior_holds_terms_the_data_cannot_see():
    X, y = synthetic(TRUE)
    X[:, TERMS.index("state")] = 0.0           # no row has linear-attention state
    est = EngineCostModel(n_bootstrap=0).fit(X, y)
    assert est.coefficients_["state"] == pytest.approx(PRIOR["state"], rel=1e-3)


def test_dcp_term_stays_physical_when_another_term_can_explain_the_data():
    """Rows where DCP is on are slower by a constant per step: the fit must put that into the
    engine's own fixed cost, not inflate the collective term."""
    rng = np.random.default_rng(3)
    n = 40
    X = np.zeros((n, len(TERMS)))
    steps = 1000.0
    X[:, TERMS.index("kv_read")] = rng.uniform(1, 5, n)
    X[:, TERMS.index("dcp_comm")] = np.where(np.arange(n) % 2, 0.5, 0.0)
    X[:, TERMS.index("step_fixed")] = steps
    y = X[:, TERMS.index("kv_read")] + 0.03 * steps + np.where(np.arange(n) % 2, 20.0, 0.0)
    est = EngineCostModel(n_bootstrap=0).fit(X, y)
    assert est.coefficients_["dcp_comm"] == pytest.approx(1.0, rel=0.05)


def test_fit_is_deterministic_and_clone_refits_identically():
    X, y = synthetic(TRUE, noise=0.01)
    a = EngineCostModel(n_bootstrap=10).fit(X, y)
    b = clone(a).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_array_equal(a.coef_cov_, b.coef_cov_)


def test_bad_fit_inputs_are_refused():
    X, y = synthetic(TRUE)
    with pytest.raises(ValueError, match="positive"):
        EngineCostModel().fit(X, -y)
    with pytest.raises(ValueError, match=f"{len(TERMS)} columns"):
        EngineCostModel().fit(X[:, :3], y)
    with pytest.raises(ValueError, match="prior: unknown"):
        EngineCostModel(prior={"warp_drive": 1.0}).fit(X, y)


def test_sklearn_estimator_checks():
    """All generic checks pass except those feeding random feature counts: the columns are
    the named physical terms, and other shapes are refused with a clear error."""
    results = check_estimator(EngineCostModel(n_bootstrap=3), on_fail=None, on_skip=None)
    unexpected = [r["check_name"] for r in results if r["status"] == "failed"
                  and f"must have {len(TERMS)} columns" not in str(r["exception"])]
    assert unexpected == []
    assert sum(r["status"] == "passed" for r in results) >= 20
