"""The cost model's formulas give the same numbers on Python floats (one recommendation, row by
row) and on numpy arrays (grids, training); the recommender's fast object construction gives
what validation gives."""

import numpy as np
import pytest

import model.costmodel as costmodel
from model.costmodel import Case, case_features
from model.default import default_model
from model.recommend import evaluate
from model.schemas import ConfigPrediction, Exclusion, Recommendation, construct
from model.shape import bare
from model.silicon import silicon_for
from model.workload import Config, Workload, preset_shape

RNG = np.random.default_rng(7)


def random_case(shape, gpu: str, tp: int, n: int, as_lists: bool) -> Case:
    engine = RNG.choice(["vllm", "sglang"], n)
    batch = RNG.choice([1, 3, 64, 700, 5000], n).astype(float)
    context = np.exp(RNG.uniform(np.log(500), np.log(3e6), n)).round()
    output = RNG.choice([1, 17, 2048], n).astype(float)
    dcp = RNG.choice([d for d in (1, 2, 4, 8) if tp % d == 0], n).astype(float)
    fraction = RNG.choice([0.85, 0.92], n)
    share = RNG.choice([0.0, 0.5, 0.99], n)
    cols = [engine, batch, context, output, dcp, fraction]
    if as_lists:
        cols = [c.tolist() for c in cols]
        share = share.tolist()
    return Case(shape, silicon_for(Workload(context_tokens=1, output_tokens=1, preset="kimi-k3",
                                            gpu=gpu).gpu_spec()), tp, *cols, share)


@pytest.mark.parametrize("shape", [preset_shape("kimi-k3", "bf16"),
                                   preset_shape("llama-3.1-70b", "fp8"), bare(70_272)],
                         ids=["kimi-k3", "llama-70b-fp8", "bare"])
@pytest.mark.parametrize("gpu,tp", [("B300", 8), ("H200", 4)])
def test_float_rows_equal_array_rows(shape, gpu, tp, monkeypatch):
    case = random_case(shape, gpu, tp, 24, as_lists=True)
    by_row = case_features(case)
    monkeypatch.setattr(costmodel, "SCALAR_ROWS", 0)      # the same rows, vectorised
    vector = case_features(case)
    np.testing.assert_allclose(by_row.X, vector.X, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(by_row.running, vector.running)
    np.testing.assert_array_equal(by_row.capacity, vector.capacity)
    np.testing.assert_array_equal(by_row.feasible, vector.feasible)
    if vector.feasible.any():    # (Kimi-K3's weights do not fit 4 x H200: nothing does)
        batch = np.asarray(case.batch)
        assert np.any(vector.running < batch) and np.any(vector.running == batch)  # waves, not


def test_memoised_terms_repeat_exactly():
    case = random_case(preset_shape("kimi-k3", "bf16"), "B300", 8, 16, as_lists=True)
    first = case_features(case).X.copy()
    np.testing.assert_array_equal(case_features(case).X, first)


def test_construct_equals_validation():
    m = default_model()
    w = Workload(context_tokens=100_000, output_tokens=512, batch_size=16, preset="kimi-k3")
    ev = evaluate(m, w, w.model_shape(), [Config("vllm", 1), Config("sglang", 8)])
    for e in ev:
        data = e.pred.model_dump()
        valid = ConfigPrediction.model_validate(data)
        assert valid == e.pred
        assert e.pred.model_dump_json() == valid.model_dump_json()
        assert e.pred.model_fields_set == valid.model_fields_set
    values = {"engine": "vllm", "dcp_size": 1, "mem_fraction": 0.9,
              "mem_fraction_flag": "--gpu-memory-utilization", "predictions": [ev[0].pred],
              "speedup": 1.2, "confidence": "high", "crossover_context_tokens": None,
              "kv_capacity_tokens": 10, "fits_in_memory": True, "launch_command": ["vllm"],
              "reasons": ["r"], "excluded": [Exclusion(engine="sglang", reason="x")],
              "model_version": "v"}
    rec = construct(Recommendation, dict(values))
    assert rec == Recommendation.model_validate(values)
    assert rec.model_dump_json() == Recommendation.model_validate(values).model_dump_json()
    # the models construct() serves take none of what it skips
    for cls in (ConfigPrediction, Recommendation):
        assert not cls.__private_attributes__ and not cls.__pydantic_post_init__
        assert cls.model_config.get("extra") != "allow"
        assert all(f.alias is None for f in cls.model_fields.values())
