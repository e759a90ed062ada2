"""One engine's efficiencies: a scikit-learn regressor with non-negative coefficients.

Each row of ``X`` is one measured (or queried) time broken into the physical terms of
``model.terms.TERMS`` (columns in that order): seconds at the silicon's achievable rates for the
physics terms, counts for the fixed-cost terms. The prediction is ``X @ coef_``:

- a physics coefficient is the engine's inverse efficiency on that term (1 = the silicon's
  achievable rate; 2 = the engine takes twice as long for those bytes or FLOPs);
- a count coefficient is seconds per unit (per layer, per sequence, per step, per pass).

``fit`` solves non-negative least squares on relative error with a ridge pulling each
coefficient towards its prior (``PRIOR``), weighted per term (``PRIOR_STRENGTH``): physics terms
stay near the silicon unless data insist, and the DCP collective term is held at its physical
value (an engine's overheads must not be explained by DCP). A residual bootstrap gives the
coefficient covariance behind the prediction intervals.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from model.terms import PHYSICS_TERMS, TERMS

# Prior coefficient per term: physics at the silicon's achievable rate; counts in seconds.
PRIOR: dict[str, float] = {
    **{t: 1.0 for t in PHYSICS_TERMS},
    "pf_fixed": 60e-6,      # s per layer per prefill pass: eager / piecewise-graph kernels
                            # (~20 per layer at ~3 us of launch and tail each)
    "pf_batch": 5e-3,       # s per prefilled batch: scheduling, tokenisation, first sampling
    "layer_fixed": 40e-6,   # s per layer per decode step: ~15-20 kernels (norms, projections,
                            # attention, router, expert GEMMs, collectives) at 2-3 us of launch
                            # gap and tail each inside a CUDA-graph replay
    "seq_fixed": 20e-6,     # s per running sequence per step (sampling, bookkeeping)
    "step_fixed": 1e-3,     # s per decode step (scheduler, detokenise, host sync)
}
# Physics coefficients cannot fall below this: faster than the silicon's achievable rate by more
# than the spec-sheet derating (model.silicon.SPEC_EFFICIENCY, 60-85 %) would beat the peak.
PHYSICS_FLOOR = 0.6
# Ridge weight of (coef / prior - 1)^2 relative to one observation's squared relative error.
PRIOR_STRENGTH: dict[str, float] = {
    **{t: 5e-4 for t in PHYSICS_TERMS},
    # prefill physics is held 100x harder: end-to-end totals (the usual calibration data) hide
    # prefill behind decode, and a prefill efficiency fitted from them would be noise
    **{t: 3e-2 for t in ("pf_gemm", "pf_attn", "pf_comm")},
    "dcp_comm": 10.0,       # collectives are physics the engines share: held at the silicon
    "pf_fixed": 1e-5, "pf_batch": 1e-5, "layer_fixed": 1e-5, "seq_fixed": 1e-5, "step_fixed": 1e-5,
}


class EngineCostModel(RegressorMixin, BaseEstimator):
    """Non-negative efficiencies of one engine over the physical terms (module docstring).

    Parameters
    ----------
    prior : dict or None
        Prior coefficient per term (``TERMS``); None uses ``PRIOR``.
    prior_scale : float
        Multiplies every ``PRIOR_STRENGTH`` (0 turns the ridge off).
    noise_floor : float
        Minimum relative standard deviation assumed for any prediction.
    n_bootstrap : int
        Residual-bootstrap refits used to estimate the coefficient covariance.
    random_state : int
        Seed of the bootstrap (fits are deterministic).
    """

    def __init__(self, prior=None, prior_scale=1.0, noise_floor=0.03, n_bootstrap=100,
                 random_state=0):
        self.prior = prior
        self.prior_scale = prior_scale
        self.noise_floor = noise_floor
        self.n_bootstrap = n_bootstrap
        self.random_state = random_state

    def _prior_vector(self) -> np.ndarray:
        prior = {**PRIOR, **(self.prior or {})}
        unknown = set(prior) - set(TERMS)
        if unknown:
            raise ValueError(f"prior: unknown terms {sorted(unknown)}")
        vec = np.array([float(prior[t]) for t in TERMS])
        if not np.all(np.isfinite(vec)) or np.any(vec <= 0):
            raise ValueError("prior: every term's prior must be positive and finite")
        return vec

    def _solve(self, X: np.ndarray, y: np.ndarray, prior: np.ndarray) -> np.ndarray:
        # coef = prior * (floor + theta), theta >= 0: every unknown O(1), physics terms never
        # below PHYSICS_FLOOR; rows scaled by 1 / y (relative error)
        floor = np.array([PHYSICS_FLOOR if t in PHYSICS_TERMS else 0.0 for t in TERMS])
        w = 1.0 / y
        A = X * prior[None, :] * w[:, None]
        b = y * w - A @ floor
        lam = np.sqrt(self.prior_scale * np.array([PRIOR_STRENGTH[t] for t in TERMS]))
        A = np.vstack([A, np.diag(lam)])
        b = np.concatenate([b, lam * (1.0 - floor)])
        theta, _ = nnls(A, b, maxiter=50 * len(TERMS))
        return (theta + floor) * prior

    def fit(self, X, y, sample_weight=None):
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True,
                             ensure_min_samples=1)
        if X.shape[1] != len(TERMS):
            raise ValueError(f"X must have {len(TERMS)} columns {TERMS}, got {X.shape[1]}")
        if np.any(y <= 0):
            raise ValueError("y: every observed time must be positive")
        if np.any(X < 0):
            raise ValueError("X: term features must be non-negative")
        if self.noise_floor < 0 or self.prior_scale < 0:
            raise ValueError("noise_floor and prior_scale must be >= 0")
        prior = self._prior_vector()
        coef = self._solve(X, y, prior)
        pred = X @ coef
        rel = (y - pred) / np.maximum(pred, 1e-12)
        dof = max(len(y) - 1, 1)
        self.residual_rel_std_ = float(np.sqrt(np.sum(rel ** 2) / dof)) if len(y) > 1 else 0.0
        self.coef_ = coef
        rng = np.random.default_rng(self.random_state)
        samples = []
        if len(y) > 1 and self.n_bootstrap > 0 and np.any(np.abs(rel) > 1e-9):
            for _ in range(self.n_bootstrap):
                y_b = np.maximum(pred * (1.0 + rng.choice(rel, size=len(y), replace=True)),
                                 1e-12)
                samples.append(self._solve(X, y_b, prior))
        k = len(coef)
        self.coef_cov_ = np.cov(np.array(samples).T) if len(samples) > 1 else np.zeros((k, k))
        self.n_samples_fit_ = int(len(y))
        return self

    @property
    def coefficients_(self) -> dict[str, float]:
        check_is_fitted(self, "coef_")
        return {t: float(v) for t, v in zip(TERMS, self.coef_, strict=True)}

    def predict(self, X):
        check_is_fitted(self, "coef_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return X @ self.coef_

    def predict_interval(self, X, rel_sigma_extra=None, z: float = 1.645):
        """Point prediction and a (lo, hi) interval (90 % by default): parameter variance
        (bootstrap covariance) + (relative noise x prediction)^2, the relative noise being
        max(residual std, noise_floor) plus ``rel_sigma_extra`` (per row)."""
        check_is_fitted(self, "coef_")
        X = np.asarray(X, dtype=np.float64)
        pred = X @ self.coef_
        param_var = np.einsum("ij,jk,ik->i", X, self.coef_cov_, X)
        rel = max(self.residual_rel_std_, self.noise_floor)
        if rel_sigma_extra is not None:
            rel = rel + np.asarray(rel_sigma_extra, dtype=float)
        sd = np.sqrt(np.maximum(param_var, 0.0) + (rel * pred) ** 2)
        return pred, np.maximum(pred - z * sd, 0.0), pred + z * sd

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.positive_only = True
        tags.input_tags.positive_only = True
        return tags
