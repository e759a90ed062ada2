"""One engine's efficiencies on one level of the pooling: a scikit-learn regressor with
non-negative coefficients that moves only the terms the data can support.

Each row of ``X`` is one measured time broken into the physical terms of
``engine_advisor.model.physics.terms.TERMS``
(columns in that order): seconds at the silicon's achievable rates for the physics terms, counts
for the fixed-cost terms. The prediction is ``X @ coef_``:

- a physics coefficient is the engine's inverse efficiency on that term (1 = the silicon's
  achievable rate; 2 = the engine takes twice as long for those bytes or FLOPs);
- a count coefficient is seconds per unit (per layer, per sequence, per step, per pass).

``fit`` starts from ``prior`` (the level above: the physics priors ``PRIOR``, an engine's pooled
efficiencies, ...) and moves only the terms named in ``free``: non-negative least squares on
relative error, a ridge steadying each free physics term near its prior (``RIDGE``; the fewer
the points the stronger the pull), and Huber weights that
keep a point spoiled by a one-off stall (a JIT compile, say) from dragging the rest.

Which terms are free is decided by the data (``select_terms``): forward selection on the
leave-one-point-out error, starting from the prior. A term is freed only when freeing it lowers
the held-out error, and never more terms than ``max_free`` points allow. So a fit is never worse
than its prior on the points it was given, and a term the data do not inform keeps its prior.

``loo_predictions`` gives the held-out predictions in closed form (a weighted ridge's hat
matrix over each point's block of observations, on the active coefficients): they decide the
selection, the reported error, and the 90 % interval (``interval_halfwidth``: a quantile of the
held-out log errors, not a model of them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import combinations

import numpy as np
from scipy.optimize import nnls
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from engine_advisor.model.physics.terms import PHYSICS_TERMS, TERMS

# Prior coefficient per term: physics at the silicon's achievable rate; counts in seconds.
PRIOR: dict[str, float] = {
    **{t: 1.0 for t in PHYSICS_TERMS},
    "pf_fixed": 60e-6,      # s per layer per prefill pass: eager / piecewise-graph kernels
                            # (~20 per layer at ~3 us of launch and tail each)
    "pf_moe_fixed": 1.2e-3,  # s per MoE layer per prefill pass: the fused-MoE path's fixed
                             # cost of one call outside CUDA graphs (routing, permuting the tokens
                             # into expert order and back, the grouped GEMMs' launches and
                             # tails); the real H200 runs give 1.5 (vLLM) and 2.4 ms (SGLang)
                             # on DeepSeek-V2-Lite, published DeepSeek-R1 TTFTs 1.7-2.1 ms: the
                             # prior sits below them, so an engine's rows raise it where that
                             # helps
    "pf_batch": 16e-3,      # s per prefilled batch: the request's trip through the server
                            # (HTTP, tokenisation, admission by the scheduler, the first
                            # sampling and its detokenised, streamed token). Measured: vLLM
                            # 0.26.0 on the real H200 rows fits 16.3 ms (with 0.37 ms per layer
                            # pass), SGLang 0.5.16's Llama-3.1-8B TTFT at 1K tokens is 68 ms
                            # where the prefill's FLOPs take ~25 ms
    "kernel_fixed": 1.5e-6,  # s per kernel launched in a decode step
                             # (engine_advisor.model.physics.launches): its launch, ramp-up and
                             # tail inside a CUDA-graph replay, whatever it computes. Measured:
                             # the fixed part of the real H200 batch-1 steps is 1.0-2.2 us per
                             # kernel launched on five MoE models of both engines, where per
                             # layer it spans 29-72 us
    "seq_fixed": 20e-6,     # s per running sequence per step (sampling, bookkeeping)
    "step_fixed": 1e-3,     # s per decode step (scheduler, detokenise, host sync)
    "dcp_fixed": 10e-6,     # s per attention layer per step with DCP > 1: the merge of the
                            # partial outputs (a small kernel and its launch)
}
# The most a count term can plausibly cost (seconds per unit): a fit that needs more has found
# something the terms do not describe (``departure`` is then infinite). Within it, moving a
# count from its prior departs from physics as much as moving a physics term by the same factor.
COUNT_CEILING: dict[str, float] = {
    "pf_fixed": 1e-3, "pf_moe_fixed": 5e-3, "pf_batch": 0.5, "kernel_fixed": 50e-6,
    "seq_fixed": 500e-6, "step_fixed": 50e-3, "dcp_fixed": 1e-3,
}
# Physics coefficients cannot fall below this: faster than the silicon's achievable rate by more
# than the spec-sheet derating (engine_advisor.model.hardware.silicon.SPEC_EFFICIENCY, 60-85 %)
# would beat the peak.
PHYSICS_FLOOR = 0.85
# Count terms cannot fall below this share of their prior. Each prior counts the kernels or host
# steps the term stands for at their launch-and-tail cost (a decode layer: ~10-20 kernels at
# 2-3 us each); fusion and overlap hide some, not most. Below it, a fit has moved a cost into
# another count with the same span in the data: on one GPU each model's layer count is fixed,
# so per-layer and per-step costs trade freely, and a per-layer cost of 0 would reach every
# 61- or 94-layer model on the same family of GPUs.
COUNT_FLOOR = 0.5
# Except the per-step cost: the host's work between steps (scheduling, input preparation,
# detokenising), which both engines overlap with the GPU's step (vLLM's async scheduling,
# SGLang's overlap scheduler), so that most of it can vanish from the step. On vLLM 0.26.0 on an
# H200, Llama-3.1-8B (32 layers) and Qwen3-32B (64) decode at batch 1 in 4.9 and 18.9 ms: with
# 20 us per layer and their weights at the kernel tables' rate, what is left per step is 0.2 ms
# or less. Models of different layer counts tell the two costs apart.
COUNT_FLOORS = {"step_fixed": 0.1}
# Ridge weight of (coef / prior - 1)^2 relative to one observation's squared relative error:
# a free term moved 30 % from its prior costs as much as one observation 1 % off (which terms
# move at all is the selection's business; the ridge steadies the ones that do).
RIDGE = 1e-3
# A term is freed only when that lowers the held-out score by at least this share, and by more
# than NOISE_SE standard errors of its per-point gains (a gain the noise could give is none)
MIN_GAIN = 0.01
NOISE_SE = 1.0
# A stratum (a model x quantity of the data) may end no worse than its prior's median held-out
# error by more than this share of it, or this much absolute: none
STRATUM_TOLERANCE = 0.0
STRATUM_SLACK = 0.0
# Collectives are physics the engines share: held at the silicon whatever the data
HELD = ("dcp_comm",)
COUNT_RIDGE = 1e-9        # a count term's share of the ridge weight (``_ridge_weights``)
HUBER_K = 2.0               # robust weights beyond this many robust sds of relative error
ROBUST_SD_FLOOR = 0.03      # the robust sd is never taken below 3 %


def prior_vector(prior: dict[str, float] | Sequence[float] | np.ndarray | None) -> np.ndarray:
    """``prior`` as a vector over TERMS (a dict overrides ``PRIOR`` by name)."""
    if prior is None or isinstance(prior, dict):
        merged = {**PRIOR, **(prior or {})}
        unknown = set(merged) - set(TERMS)
        if unknown:
            raise ValueError(f"prior: unknown terms {sorted(unknown)}")
        vec = np.array([float(merged[t]) for t in TERMS])
    else:
        vec = np.asarray(prior, dtype=float)
        if vec.shape != (len(TERMS),):
            raise ValueError(f"prior: {len(TERMS)} values expected, got {vec.shape}")
    if not np.all(np.isfinite(vec)) or np.any(vec < 0):
        raise ValueError("prior: every term's prior must be non-negative and finite")
    return vec


class EngineCostModel(RegressorMixin, BaseEstimator):
    """Non-negative efficiencies of one engine on one pooling level (module docstring).

    Parameters
    ----------
    prior : dict, array or None
        The coefficients of the level above, per term (``TERMS``); None uses ``PRIOR``.
    free : list of str or None
        The terms the data may move; the rest stay at their prior. None frees every term
        (but the ``HELD`` ones).
    ridge : float
        Weight of each free term's (coef / prior - 1)^2 (``RIDGE``).
    robust : bool
        Huber-reweight observations whose relative error is far beyond the others'.
    noise_floor : float
        Minimum relative standard deviation assumed for any prediction.
    """

    def __init__(self, prior=None, free=None, ridge=RIDGE, robust=True, noise_floor=0.03):
        self.prior = prior
        self.free = free
        self.ridge = ridge
        self.robust = robust
        self.noise_floor = noise_floor

    # ------------------------------------------------------------------ solving
    def _free_mask(self) -> np.ndarray:
        names = TERMS if self.free is None else tuple(self.free)
        unknown = set(names) - set(TERMS)
        if unknown:
            raise ValueError(f"free: unknown terms {sorted(unknown)}")
        return np.array([t in names and t not in HELD for t in TERMS])

    @staticmethod
    def _floors(prior: np.ndarray) -> np.ndarray:
        """Lowest coefficient per term, as a multiple of its prior (``PHYSICS_FLOOR``,
        ``COUNT_FLOOR``, ``COUNT_FLOORS``)."""
        return np.array([PHYSICS_FLOOR if t in PHYSICS_TERMS else COUNT_FLOORS.get(t, COUNT_FLOOR)
                         for t in TERMS])

    def _solve(self, X, y, w, prior, free):
        """Coefficients: fixed terms at their prior; free ones by NNLS on weighted relative
        error with the ridge, as multiples theta >= floor of their prior."""
        coef = prior.copy()
        idx = np.flatnonzero(free & (prior > 0))
        if idx.size == 0:
            return coef
        floor = self._floors(prior)[idx]
        fixed = np.ones(len(prior), dtype=bool)
        fixed[idx] = False
        base = X[:, fixed] @ prior[fixed]
        s = np.sqrt(w) / y
        A = X[:, idx] * prior[idx][None, :] * s[:, None]
        b = (y - base) * s - A @ floor
        lam = np.sqrt(self._ridge_weights()[idx])
        A = np.vstack([A, np.diag(lam)])
        b = np.concatenate([b, lam * (1.0 - floor)])
        theta, _ = nnls(A, b, maxiter=50 * idx.size + 50)
        coef[idx] = (theta + floor) * prior[idx]
        return coef

    def _ridge_weights(self) -> np.ndarray:
        """Each term's ridge weight: ``ridge`` for physics terms, ``COUNT_RIDGE`` of it for count
        terms. The ridge pulls in linear units, ``(coef / prior - 1)^2``: a kernel's efficiency
        moves by a factor of 2 or so, a count's prior is a guess that the data move 10-100 x (on
        the simulated engines' rows the same pull held the per-pass and per-step costs back and
        the held-out error rose from 1-2 % to 54 %). How hard a count is to move is decided
        where it is measured in log units, as a physics term's: which terms move and how far a
        fit departs (``departure``)."""
        return np.array([self.ridge * (1.0 if t in PHYSICS_TERMS else COUNT_RIDGE)
                         for t in TERMS])

    def _robust_weights(self, X, y, coef) -> np.ndarray:
        rel = (y - X @ coef) / y
        sd = max(1.4826 * float(np.median(np.abs(rel - np.median(rel)))), ROBUST_SD_FLOOR)
        a = np.abs(rel) / sd
        return np.where(a <= HUBER_K, 1.0, HUBER_K / np.maximum(a, 1e-12))

    def _fit_arrays(self, X, y, prior, free, w0=None):
        w = np.ones(len(y)) if w0 is None else np.asarray(w0, dtype=float)
        coef = self._solve(X, y, w, prior, free)
        if self.robust and len(y) > 3:
            for _ in range(4):
                w = self._robust_weights(X, y, coef)
                coef = self._solve(X, y, w, prior, free)
        return coef, w

    # ------------------------------------------------------------------ sklearn API
    def fit(self, X, y, sample_weight=None):
        """Fit the free terms; ``sample_weight`` (per observation) is the starting weight of
        the Huber reweighting, or, with ``robust=False``, the weight itself."""
        X, y = validate_data(self, X, y, dtype=np.float64, y_numeric=True,
                             ensure_min_samples=1)
        if X.shape[1] != len(TERMS):
            raise ValueError(f"X must have {len(TERMS)} columns {TERMS}, got {X.shape[1]}")
        if np.any(y <= 0):
            raise ValueError("y: every observed time must be positive")
        if np.any(X < 0):
            raise ValueError("X: term features must be non-negative")
        if sample_weight is not None:
            sw = np.asarray(sample_weight, dtype=float)
            if sw.shape != y.shape or np.any(sw < 0) or not np.all(np.isfinite(sw)):
                raise ValueError("sample_weight: one non-negative finite weight per "
                                 "observation expected")
            if not np.any(sw > 0):
                raise ValueError("sample_weight: every weight is zero, nothing to fit")
        if self.noise_floor < 0 or self.ridge < 0:
            raise ValueError("noise_floor and ridge must be >= 0")
        prior = prior_vector(self.prior)
        free = self._free_mask()
        coef, w = self._fit_arrays(X, y, prior, free, sample_weight)
        pred = X @ coef
        rel = (y - pred) / np.maximum(pred, 1e-12)
        dof = max(len(y) - int(free.sum()), 1)
        self.residual_rel_std_ = float(np.sqrt(np.sum(w * rel ** 2) / dof)) if len(y) > 1 \
            else 0.0
        self.coef_ = coef
        self.prior_ = prior
        self.free_ = [t for t, f in zip(TERMS, free, strict=True) if f]
        self.weights_ = w
        self.n_samples_fit_ = int(len(y))
        # intervals come from held-out errors (CostModel sets interval_halfwidth_); the
        # coefficients' own covariance is not modelled separately
        self.coef_cov_ = np.zeros((len(TERMS), len(TERMS)))
        if not hasattr(self, "interval_halfwidth_"):
            self.interval_halfwidth_ = None
        return self

    @property
    def coefficients_(self) -> dict[str, float]:
        check_is_fitted(self, "coef_")
        return {t: float(v) for t, v in zip(TERMS, self.coef_, strict=True)}

    @property
    def relative_noise_(self) -> float:
        """The relative sd behind a prediction's 90 % interval: the held-out half-width when
        known (``interval_halfwidth_``, log error), else the residual sd, never below the
        noise floor."""
        check_is_fitted(self, "coef_")
        if self.interval_halfwidth_ is not None:
            return max(math.expm1(self.interval_halfwidth_) / 1.645, self.noise_floor)
        return max(self.residual_rel_std_, self.noise_floor)

    def predict(self, X):
        check_is_fitted(self, "coef_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return X @ self.coef_

    def predict_interval(self, X, rel_sigma_extra=None, z: float = 1.645):
        """Point prediction and a (lo, hi) interval (90 % by default): ``relative_noise_``
        (plus ``rel_sigma_extra`` per row) times the prediction."""
        check_is_fitted(self, "coef_")
        X = np.asarray(X, dtype=np.float64)
        pred = X @ self.coef_
        rel = self.relative_noise_
        if rel_sigma_extra is not None:
            rel = rel + np.asarray(rel_sigma_extra, dtype=float)
        sd = rel * pred
        return pred, np.maximum(pred - z * sd, 0.0), pred + z * sd

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.positive_only = True
        tags.input_tags.positive_only = True
        return tags

    # ------------------------------------------------------------------ held out
    def loo_predictions(self, X, y, groups) -> np.ndarray:
        """Each observation predicted by the fit without its group (point): the closed form
        of a weighted ridge on the coefficients that are free and not at their floor, with the
        others held where the full fit put them."""
        check_is_fitted(self, "coef_")
        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        groups = np.asarray(groups)
        prior, coef = self.prior_, self.coef_
        free = np.array([t in self.free_ for t in TERMS])
        floor = self._floors(prior) * prior
        active = np.flatnonzero(free & (prior > 0) & (coef > floor * (1 + 1e-9)))
        pred = X @ coef
        if active.size == 0:
            return pred
        s = np.sqrt(self.weights_) / y
        Z = X[:, active] * prior[active][None, :] * s[:, None]       # in theta units
        G = Z.T @ Z + np.diag(self._ridge_weights()[active])
        try:
            Ginv = np.linalg.inv(G)
        except np.linalg.LinAlgError:
            Ginv = np.linalg.pinv(G)
        r = (y - pred) * s                                           # weighted residuals
        out = pred.copy()
        for g in np.unique(groups):
            i = np.flatnonzero(groups == g)
            Zi = Z[i]
            H = Zi @ Ginv @ Zi.T
            try:
                e = np.linalg.solve(np.eye(len(i)) - H, r[i])
            except np.linalg.LinAlgError:
                e = np.linalg.lstsq(np.eye(len(i)) - H, r[i], rcond=None)[0]
            # held-out residual e (weighted units) -> held-out prediction
            out[i] = y[i] - e / s[i]
        return np.maximum(out, 1e-12)


def log_errors(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.abs(np.log(np.maximum(pred, 1e-12) / y))


def held_out_error(err: np.ndarray) -> float:
    """The selection's score of held-out log errors: their mean, each clipped at log 2 (a
    point off by more than 2x counts as 2x: one stall must not decide which terms move)."""
    return float(np.mean(np.minimum(err, math.log(2.0)))) if len(err) else 0.0


def max_free(n_points: int) -> int:
    """How many coefficients ``n_points`` grid points may move: as many as there are up to
    two (two published points may move two numbers), then half of them."""
    return min(n_points, max(2, n_points // 2))


MIN_HELD_OUT_POINTS = 3   # below this, a point held out says too little: in-sample selection


def select_terms(X, y, groups, prior, candidates: Sequence[str], *, ridge: float = RIDGE,
                 limit: int | None = None, noise_floor: float = 0.03, strata=None):
    """Forward selection of the free terms (module docstring): returns the fitted estimator,
    its held-out predictions, and the prior's predictions (the prior is not fitted to these
    points, so they are held out too).

    ``strata`` (one label per observation, e.g. model x quantity) guards every part of the
    data: the selection ends on its last step where no stratum's median held-out error is
    above its prior's (``STRATUM_TOLERANCE``, ``STRATUM_SLACK``)."""
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    prior = prior_vector(prior)
    n_points = len(np.unique(groups))
    limit = max_free(n_points) if limit is None else limit
    in_sample = n_points < MIN_HELD_OUT_POINTS
    if in_sample:       # two points fix two numbers: a pull towards the prior would only bias
        ridge = min(ridge, 1e-8)
    pool = [t for i, t in enumerate(TERMS)
            if t in candidates and t not in HELD and prior[i] > 0 and np.any(X[:, i] > 0)]
    chosen: list[str] = []
    base_pred = X @ prior
    best = EngineCostModel(prior=prior.tolist(), free=[], ridge=ridge,
                           noise_floor=noise_floor).fit(X, y)
    best_loo = base_pred
    _, inverse = np.unique(groups, return_inverse=True)
    labels = (np.zeros(len(y), dtype=int) if strata is None
              else np.unique(np.asarray(strata), return_inverse=True)[1])

    def clipped(pred):
        return np.minimum(log_errors(pred, y), math.log(2.0))

    def per_point(err):
        return np.bincount(inverse, weights=err) / np.bincount(inverse)

    def per_stratum(err):                 # the median: what the fit report states
        return np.array([np.median(err[labels == k]) for k in range(labels.max() + 1)])

    def strata_hold(err) -> bool:         # no stratum worse than its prior
        return bool(np.all(per_stratum(err) <= np.maximum(
            prior_strata * (1 + STRATUM_TOLERANCE), prior_strata + STRATUM_SLACK)))

    if in_sample:
        best = _least_departure(X, y, prior, pool, limit, ridge, noise_floor)
        return best, best.loo_predictions(X, y, groups), base_pred
    prior_strata = per_stratum(clipped(base_pred))
    best_err = per_point(clipped(base_pred))
    path = [(best, best_loo, True)]      # (fit, held-out predictions, every stratum holds)
    while len(chosen) < limit and pool:
        trials = []
        w = best.weights_           # each trial starts from the current fit's Huber weights
        for t in pool:
            est = EngineCostModel(prior=prior.tolist(), free=[*chosen, t], ridge=ridge,
                                  robust=False, noise_floor=noise_floor).fit(
                                      X, y, sample_weight=w)
            pred = est.predict(X) if in_sample else est.loo_predictions(X, y, groups)
            trials.append((float(per_point(clipped(pred)).mean()), t))
        accepted = None
        for _, t in sorted(trials):
            trial = EngineCostModel(prior=prior.tolist(), free=[*chosen, t], ridge=ridge,
                                    noise_floor=noise_floor).fit(X, y)
            trial_loo = trial.loo_predictions(X, y, groups)
            err = clipped(trial.predict(X) if in_sample else trial_loo)
            gain = best_err - per_point(err)
            noise = 0.0 if in_sample else NOISE_SE * float(gain.std(ddof=1)) / math.sqrt(
                len(gain))
            if gain.mean() > max(MIN_GAIN * best_err.mean(), noise):
                accepted = (t, trial, trial_loo, per_point(err), strata_hold(err))
                break
        if accepted is None:
            break
        t, best, best_loo, best_err, holds = accepted
        chosen.append(t)
        pool.remove(t)
        path.append((best, best_loo, holds))
    # the furthest step of the path on which no stratum is worse than its prior: a term that
    # helps one part of the data only by hurting another is not kept (nor what came after)...
    best, best_loo, _ = next(p for p in reversed(path) if p[2])
    if not path[-1][2] and len(chosen) < limit:
        # ...unless one or two more terms bring every stratum back, keeping more of the
        # path's gain: a greedy step cannot see that the part of the data an earlier term
        # hurt needs two terms to recover (one more GPU kernel's efficiency and a count)
        repairs = []
        for k in (1, 2):
            for extra in combinations(pool, k) if len(chosen) + k <= limit else ():
                trial = EngineCostModel(prior=prior.tolist(), free=[*chosen, *extra],
                                        ridge=ridge, noise_floor=noise_floor).fit(X, y)
                trial_loo = trial.loo_predictions(X, y, groups)
                err = clipped(trial_loo)
                if strata_hold(err):
                    repairs.append((float(per_point(err).mean()), k, trial, trial_loo))
        if repairs:
            score, _, trial, trial_loo = min(repairs, key=lambda r: (r[0], r[1]))
            if score < float(per_point(clipped(best_loo)).mean()):
                best, best_loo = trial, trial_loo
    return best, best_loo, base_pred


IN_SAMPLE_FIT = 0.03      # a few points "are explained" when the fit is this close to each


def departure(est: EngineCostModel) -> float:
    """How far a fit moved from physics: the sum of |log(coef / prior)| over its free terms,
    count terms as much as physics terms (two terms moved 3 x each depart as far as one moved
    9 x); infinite when a count term went past its ``COUNT_CEILING``."""
    out = 0.0
    for i, t in enumerate(TERMS):
        if t not in est.free_:
            continue
        if t in COUNT_CEILING and est.coef_[i] > COUNT_CEILING[t]:
            return math.inf
        if est.prior_[i] > 0:
            out += abs(math.log(max(est.coef_[i] / est.prior_[i], 1e-6)))
    return out


def _least_departure(X, y, prior, pool, limit, ridge, noise_floor) -> EngineCostModel:
    """With too few points to hold any out: of the sets of at most ``limit`` terms whose fit
    explains every observation (within ``IN_SAMPLE_FIT``) with count terms within their
    ceilings, the one that departs least from physics (``departure``); when none does, the set
    with the smallest error."""
    fits = []
    for k in range(0, limit + 1):
        for free in combinations(pool, k):
            est = EngineCostModel(prior=prior.tolist(), free=list(free), ridge=ridge,
                                  noise_floor=noise_floor).fit(X, y)
            err = float(np.max(np.abs(est.predict(X) / y - 1.0)))
            fits.append((err, departure(est), k, est))
    explained = [f for f in fits if f[0] <= IN_SAMPLE_FIT and math.isfinite(f[1])]
    if explained:
        return min(explained, key=lambda f: (f[1], f[2]))[3]
    return min(fits, key=lambda f: (f[0], f[2]))[3]


def interval_halfwidth(err: np.ndarray, coverage: float = 0.90) -> float | None:
    """A half-width (log error) that covers ``coverage`` of future points exchangeable with
    these held-out errors: the ceil(coverage (n + 1))-th smallest (split-conformal); with too
    few errors for that, the largest times 1.5. None without errors."""
    err = np.sort(np.asarray(err, dtype=float))
    n = len(err)
    if n == 0:
        return None
    k = math.ceil(coverage * (n + 1))
    if k > n:
        return float(err[-1] * 1.5)
    return float(err[k - 1])
