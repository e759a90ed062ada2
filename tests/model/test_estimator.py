import itertools

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import check_estimator

from model.costmodel import CostModel
from model.dataset import Measurement
from model.estimator import (
    COEF_NAMES,
    QTY_PREFILL,
    QTY_TOTAL,
    QTY_TPOT,
    EngineCostModel,
    design_matrix,
)

TRUE = {"prefill_fixed_s": 0.3, "prefill_s_per_mtoken": 4.0, "prefill_attn_s_per_unit": 0.08,
        "step_fixed_s": 0.006, "step_s_per_seq": 8e-5, "kv_efficiency_inv": 1.3,
        "dcp_sync_s_per_log2": 0.003, "dcp_combine_s_per_seq": 4e-5}
BW = 8e12


def synthetic(coef: dict[str, float], noise: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    c = np.array([coef[n] for n in COEF_NAMES])
    rows = []
    for ctx, b, dcp, out in itertools.product([4096, 16384, 65536, 131072, 262144], [1, 8, 64],
                                              [1, 2, 8], [256]):
        kv = 70272.0
        read = b * (ctx + out / 2) * kv / dcp / BW
        for q in (QTY_TOTAL, QTY_PREFILL, QTY_TPOT):
            rows.append([ctx, out, b, kv, dcp, read, q])
    X = np.array(rows, dtype=float)
    y = design_matrix(X) @ c
    return X, y * (1 + noise * rng.standard_normal(len(y)))


def test_recovers_known_coefficients_within_2_percent():
    X, y = synthetic(TRUE)
    est = EngineCostModel().fit(X, y)
    for name, value in TRUE.items():
        assert est.coefficients_[name] == pytest.approx(value, rel=0.02), name


def test_recovers_from_noisy_data_and_intervals_cover():
    X, y = synthetic(TRUE, noise=0.02, seed=1)
    est = EngineCostModel().fit(X, y)
    assert est.coefficients_["kv_efficiency_inv"] == pytest.approx(1.3, rel=0.02)
    X_clean, y_clean = synthetic(TRUE)
    pred, lo, hi = est.predict_interval(X_clean)
    assert np.median(np.abs(pred / y_clean - 1)) < 0.02
    assert np.mean((lo <= y_clean) & (y_clean <= hi)) > 0.9


def test_coefficients_are_non_negative_even_for_adversarial_data():
    X, y = synthetic(TRUE)
    y = y[::-1].copy()  # nonsense pairing: the NNLS must still keep physics signs
    est = EngineCostModel().fit(X, y)
    assert np.all(est.coef_ >= 0)


def _rows(ctx, kv=70272.0, dcp=1.0, b=64.0, out=2048.0, bw=BW):
    ctx = np.asarray(ctx, dtype=float)
    read = b * (ctx + out / 2) * kv / dcp / bw
    return np.column_stack([ctx, np.full_like(ctx, out), np.full_like(ctx, b),
                            np.full_like(ctx, kv), np.full_like(ctx, dcp), read,
                            np.full_like(ctx, QTY_TOTAL)])


def test_monotone_in_context_and_kv_bytes_and_linear_beyond_data():
    est = EngineCostModel().fit(*synthetic(TRUE))
    ctx = np.geomspace(1024, 8 * 1024 * 1024, 200)
    total = est.predict(_rows(ctx))
    assert np.all(np.diff(total) > 0)
    assert np.all(est.predict(_rows(ctx, kv=35136.0)) < total)
    assert np.all(np.diff(est.predict(_rows(ctx, kv=35136.0))) > 0)
    # Far outside the data (8M tokens) it keeps growing like the physics, not flat like a tree.
    big = est.predict(_rows([4e6, 8e6]))
    assert big[1] / big[0] > 1.9


def test_larger_dcp_lowers_kv_read_time():
    est = EngineCostModel().fit(*synthetic(TRUE))
    kv_coef = est.coefficients_["kv_efficiency_inv"]
    reads = [kv_coef * _rows([200_000], dcp=d)[0, 5] for d in (1, 2, 4, 8)]
    assert all(a > b for a, b in zip(reads, reads[1:], strict=False))
    # and at long context the whole step gets faster with DCP despite the combine cost
    tp = _rows([200_000], dcp=1)
    tp[:, 6] = QTY_TPOT
    t8 = _rows([200_000], dcp=8)
    t8[:, 6] = QTY_TPOT
    assert est.predict(t8)[0] < est.predict(tp)[0]


def test_dcp_combine_cost_is_zero_at_dcp_1():
    D = design_matrix(_rows([65536], dcp=1))
    assert D[0, COEF_NAMES.index("dcp_sync_s_per_log2")] == 0
    assert D[0, COEF_NAMES.index("dcp_combine_s_per_seq")] == 0
    D8 = design_matrix(_rows([65536], dcp=8))
    assert D8[0, COEF_NAMES.index("dcp_sync_s_per_log2")] > 0


def test_fit_is_deterministic_and_clone_refits_identically():
    X, y = synthetic(TRUE, noise=0.01)
    a = EngineCostModel().fit(X, y)
    b = clone(a).fit(X, y)
    np.testing.assert_array_equal(a.coef_, b.coef_)
    np.testing.assert_array_equal(a.coef_cov_, b.coef_cov_)


def test_bad_fit_inputs_are_refused():
    X, y = synthetic(TRUE)
    with pytest.raises(ValueError, match="positive"):
        EngineCostModel().fit(X, -y)
    with pytest.raises(ValueError, match="7 columns"):
        EngineCostModel().fit(X[:, :3], y)
    with pytest.raises(ValueError, match="prior: unknown"):
        EngineCostModel(prior={"warp_drive": 1.0}).fit(X, y)


def test_sklearn_estimator_checks():
    """All generic checks pass except those feeding random feature counts: this estimator has
    a fixed physical column schema (COLUMNS) and refuses other shapes with a clear error."""
    results = check_estimator(EngineCostModel(n_bootstrap=3), on_fail=None, on_skip=None)
    unexpected = [r["check_name"] for r in results if r["status"] == "failed"
                  and "must have 7 columns" not in str(r["exception"])]
    assert unexpected == []
    assert sum(r["status"] == "passed" for r in results) >= 20


def test_engine_without_dcp_data_borrows_dcp_costs():
    rows = [Measurement(engine=e, gpu="B300", num_gpus=8, dcp_size=d, mem_fraction=0.9,
                        context_tokens=c, output_tokens=256, batch_size=8,
                        kv_bytes_per_token=70272, total_s=t)
            for e, d, c, t in [("sglang", 8, 8192, 5.0), ("sglang", 8, 131072, 9.0),
                               ("sglang", 8, 65536, 7.0), ("vllm", 1, 8192, 3.0),
                               ("vllm", 1, 131072, 12.0)]]
    m = CostModel.fit(rows)
    s, v = m.engines["sglang"].coefficients_, m.engines["vllm"].coefficients_
    assert v["dcp_sync_s_per_log2"] == pytest.approx(s["dcp_sync_s_per_log2"], rel=0.05)
