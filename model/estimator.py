"""The cost model of one engine: a scikit-learn regressor with non-negative physical coefficients.

Each row of ``X`` describes one measured (or queried) quantity of one workload on one
configuration; the columns are ``COLUMNS``. The last column says which quantity the row is:

- ``QTY_TOTAL`` (0): wall time of the whole workload = prefill + (output_tokens - 1) decode steps
- ``QTY_PREFILL`` (1): prefill time (TTFT of the batch)
- ``QTY_TPOT`` (2): time per decode step (TPOT)

Every quantity is linear in the coefficients, so one non-negative least-squares fit uses TTFT,
TPOT and total-time measurements together. Rows are weighted by 1 / observed value (relative
error), and a weak ridge pulls each coefficient towards a physical prior so that directions the
data cannot resolve (two points per engine in the published benchmark) stay physically sensible.

Decode step at context c (contexts c = ctx+1 ... ctx+S-1 average ctx + S/2, and every feature is
linear in c, so the sum over steps is exact):

    step = step_fixed + step_per_seq * B + kv_efficiency_inv * kv_read_s(B * c * kv / dcp)
           + dcp_sync * log2(dcp) + dcp_combine * B * (dcp - 1) / dcp

Prefill: ``prefill_fixed + prefill_per_mtoken * B*ctx/1e6 + prefill_attn * B*ctx^2*kv/1e15``.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

COLUMNS = ("context_tokens", "output_tokens", "batch_size", "kv_bytes_per_gpu_token",
           "dcp_size", "kv_read_s", "quantity")
QTY_TOTAL, QTY_PREFILL, QTY_TPOT = 0, 1, 2
# Optional last column: the combine feature measured by a DCP profile (see feature_blocks).
OPTIONAL_COLUMN = "dcp_combine_seq"

COEF_NAMES = ("prefill_fixed_s", "prefill_s_per_mtoken", "prefill_attn_s_per_unit",
              "step_fixed_s", "step_s_per_seq", "kv_efficiency_inv", "dcp_sync_s_per_log2",
              "dcp_combine_s_per_seq")
N_PREFILL = 3

# Physical priors (theta = 1 means "at the prior"). Scale-setting only: with data they are
# overridden; see prior_strength.
DEFAULT_PRIOR = {
    "prefill_fixed_s": 0.2,
    "prefill_s_per_mtoken": 2.0,
    "prefill_attn_s_per_unit": 0.05,
    "step_fixed_s": 0.004,
    "step_s_per_seq": 5e-5,
    "kv_efficiency_inv": 1.25,       # 80 % of peak bandwidth
    "dcp_sync_s_per_log2": 0.002,    # ~61 layers x ~10 us collective per doubling
    "dcp_combine_s_per_seq": 2e-5,
}


def feature_blocks(ctx, out, batch, kv, dcp, kv_read_s,
                   dcp_combine=None) -> tuple[np.ndarray, np.ndarray]:
    """Prefill features (n, 3) and per-decode-step features (n, 5) of workload columns.

    ``dcp_combine`` (optional, per row; NaN = not given): the combine work in sequence-
    equivalents from a measured DCP profile (model.hardware.DcpCommModel), replacing the spec
    shape ``batch * (dcp - 1) / dcp`` of the combine feature.
    """
    pre = np.empty((len(ctx), N_PREFILL))
    pre[:, 0] = 1.0
    tokens = batch * ctx
    pre[:, 1] = tokens * 1e-6
    pre[:, 2] = tokens * ctx * kv * 1e-15
    step = np.empty((len(ctx), len(COEF_NAMES) - N_PREFILL))
    step[:, 0] = 1.0
    step[:, 1] = batch
    step[:, 2] = kv_read_s
    dcp_safe = np.maximum(dcp, 1.0)
    step[:, 3] = np.log2(dcp_safe)
    step[:, 4] = batch * (dcp_safe - 1.0) / dcp_safe
    if dcp_combine is not None:
        measured = np.asarray(dcp_combine, dtype=float)
        step[:, 4] = np.where(np.isfinite(measured), measured, step[:, 4])
    return pre, step


def design_matrix(X: np.ndarray) -> np.ndarray:
    """Map raw rows (COLUMNS) to the linear design matrix (one column per coefficient)."""
    pre, step = feature_blocks(*(X[:, i] for i in range(6)),
                               X[:, len(COLUMNS)] if X.shape[1] > len(COLUMNS) else None)
    qty = X[:, 6]
    steps = np.maximum(X[:, 1] - 1.0, 0.0)
    is_total = qty == QTY_TOTAL
    pre_w = (is_total | (qty == QTY_PREFILL)).astype(float)
    step_w = np.where(is_total, steps, (qty == QTY_TPOT).astype(float))
    return np.hstack([pre * pre_w[:, None], step * step_w[:, None]])


class EngineCostModel(RegressorMixin, BaseEstimator):
    """Non-negative physical cost model of one engine (see module docstring).

    Parameters
    ----------
    prior : dict or None
        Prior value of each coefficient (``COEF_NAMES``); None uses ``DEFAULT_PRIOR``.
    prior_strength : float
        Weight of the ridge towards the prior, relative to one observation at 100 % error.
    noise_floor : float
        Minimum relative standard deviation assumed for any prediction.
    n_bootstrap : int
        Residual-bootstrap refits used to estimate the coefficient covariance.
    random_state : int
        Seed of the bootstrap (fits are deterministic).
    """

    def __init__(self, prior=None, prior_strength=1e-6, noise_floor=0.03, n_bootstrap=100,
                 random_state=0):
        self.prior = prior
        self.prior_strength = prior_strength
        self.noise_floor = noise_floor
        self.n_bootstrap = n_bootstrap
        self.random_state = random_state

    def _prior_vector(self) -> np.ndarray:
        prior = {**DEFAULT_PRIOR, **(self.prior or {})}
        unknown = set(prior) - set(COEF_NAMES)
        if unknown:
            raise ValueError(f"prior: unknown coefficients {sorted(unknown)}")
        vec = np.array([float(prior[name]) for name in COEF_NAMES])
        if not np.all(np.isfinite(vec)) or np.any(vec <= 0):
            raise ValueError("prior: every coefficient prior must be positive and finite")
        return vec

    def _solve(self, D: np.ndarray, y: np.ndarray, w: np.ndarray, prior: np.ndarray) -> np.ndarray:
        # Parametrise coef = prior * theta so every unknown is O(1); rows scaled by w.
        A = D * prior[None, :] * w[:, None]
        b = y * w
        k = D.shape[1]
        lam = np.sqrt(self.prior_strength)
        A = np.vstack([A, lam * np.eye(k)])
        b = np.concatenate([b, lam * np.ones(k)])
        theta, _ = nnls(A, b, maxiter=50 * k)
        return theta * prior

    def fit(self, X, y, sample_weight=None):
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True,
                             ensure_min_samples=1)
        if X.shape[1] not in (len(COLUMNS), len(COLUMNS) + 1):
            raise ValueError(f"X must have {len(COLUMNS)} columns {COLUMNS} (or one more, "
                             f"{OPTIONAL_COLUMN!r}), got {X.shape[1]}")
        if np.any(y <= 0):
            raise ValueError("y: every observed time must be positive")
        if np.any(X < 0):
            raise ValueError("X: sizes, contexts and times must be non-negative")
        if self.noise_floor < 0 or self.prior_strength < 0:
            raise ValueError("noise_floor and prior_strength must be >= 0")
        prior = self._prior_vector()
        D = design_matrix(X)
        w = 1.0 / y
        if sample_weight is not None:
            w = w * np.sqrt(np.asarray(sample_weight, dtype=float))
        coef = self._solve(D, y, w, prior)
        pred = D @ coef
        rel = (y - pred) / np.maximum(pred, 1e-12)
        dof = max(len(y) - np.count_nonzero(coef), 1)
        self.residual_rel_std_ = float(np.sqrt(np.sum(rel**2) / dof)) if len(y) > 1 else 0.0
        self.coef_ = coef
        # Residual bootstrap of relative residuals -> coefficient covariance.
        rng = np.random.default_rng(self.random_state)
        samples = []
        if len(y) > 1 and self.n_bootstrap > 0 and np.any(rel != 0):
            for _ in range(self.n_bootstrap):
                y_b = pred * (1.0 + rng.choice(rel, size=len(y), replace=True))
                y_b = np.maximum(y_b, 1e-12)
                samples.append(self._solve(D, y_b, 1.0 / y_b, prior))
        k = len(coef)
        self.coef_cov_ = np.cov(np.array(samples).T) if len(samples) > 1 else np.zeros((k, k))
        self.n_samples_fit_ = int(len(y))
        return self

    @property
    def coefficients_(self) -> dict[str, float]:
        check_is_fitted(self, "coef_")
        return {name: float(v) for name, v in zip(COEF_NAMES, self.coef_, strict=True)}

    def predict(self, X):
        check_is_fitted(self, "coef_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return self.predict_rows(X)

    def predict_rows(self, X: np.ndarray) -> np.ndarray:
        """``predict`` without input validation, for rows built by this package (hot path)."""
        return design_matrix(X) @ self.coef_

    def predict_interval(self, X, rel_sigma_extra=None, z: float = 1.645):
        """Point prediction and a (lo, hi) interval (90 % by default).

        Variance = parameter variance (bootstrap covariance) + (relative noise x prediction)^2,
        the relative noise being max(residual std, noise_floor) widened by ``rel_sigma_extra``
        (per row, e.g. for extrapolation).
        """
        check_is_fitted(self, "coef_")
        X = np.asarray(X, dtype=np.float64)
        D = design_matrix(X)
        pred = D @ self.coef_
        param_var = np.einsum("ij,jk,ik->i", D, self.coef_cov_, D)
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
