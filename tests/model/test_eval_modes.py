"""The compiled formulas (engine_advisor.model.formulas) give what the same code gives run as plain
Python (NUMBA_DISABLE_JIT=1, in a subprocess); lists and arrays give the same rows; the
recommender's fast object construction gives what validation gives, and its fast JSON what pydantic
writes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from engine_advisor.model.errors import NoEligibleConfiguration
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.hardware.silicon import silicon_for
from engine_advisor.model.physics.features import Case, case_features
from engine_advisor.model.physics.shape import bare, preset_shape
from engine_advisor.model.queries import evaluate
from engine_advisor.model.recommend import recommend
from engine_advisor.model.schemas import (
    ConfigPrediction,
    ConfigRef,
    Exclusion,
    Recommendation,
    constructor,
    to_json,
)
from engine_advisor.model.workload import Config, Workload

SHAPES = {"kimi-k3": lambda: preset_shape("kimi-k3", "bf16"),
          "llama-70b-fp8": lambda: preset_shape("llama-3.1-70b", "fp8"),
          "bare": lambda: bare(70_272)}
HARDWARE = [("B300", 8), ("H200", 4)]


def random_case(shape_name: str, gpu: str, tp: int, n: int, seed: int,
                as_lists: bool = False) -> Case:
    rng = np.random.default_rng(seed)
    engine = rng.choice(["vllm", "sglang"], n)
    batch = rng.choice([1, 3, 64, 700, 5000], n).astype(float)
    context = np.exp(rng.uniform(np.log(500), np.log(3e6), n)).round()
    output = rng.choice([1, 17, 2048], n).astype(float)
    dcp = rng.choice([d for d in (1, 2, 4, 8) if tp % d == 0], n).astype(float)
    fraction = rng.choice([0.85, 0.92], n)
    share = rng.choice([0.0, 0.5, 0.99], n)
    cols = [engine, batch, context, output, dcp, fraction, share]
    if as_lists:
        cols = [c.tolist() for c in cols]
    gpu_spec = Workload(context_tokens=1, output_tokens=1, preset="kimi-k3", gpu=gpu).gpu_spec()
    return Case(SHAPES[shape_name](), silicon_for(gpu_spec), tp, *cols)


def features_of_every_case() -> dict:
    out = {}
    for name in SHAPES:
        for gpu, tp in HARDWARE:
            case = random_case(name, gpu, tp, 400, seed=len(out))
            f = case_features(case)
            out[f"{name}/{gpu}/{tp}"] = {"X": f.X.tolist(), "running": f.running.tolist(),
                                         "capacity": f.capacity.tolist(),
                                         "feasible": f.feasible.tolist(),
                                         "batch": np.asarray(case.batch).tolist()}
    return out


QUERIES = [dict(context_tokens=150_000, output_tokens=2048, batch_size=64, preset="kimi-k3"),
           dict(context_tokens=32_768, output_tokens=512, batch_size=600, gpu="H200",
                num_gpus=8, preset="llama-3.1-70b", requirements={"prefix_reuse_share": 0.4}),
           dict(context_tokens=8192, output_tokens=256, batch_size=4, gpu="H200", num_gpus=1,
                kv_bytes_per_token=70_272)]


def evaluations() -> list:
    """Each of QUERIES' configurations as ``Query.evaluate`` reports them (one compiled call
    of ``engine_advisor.model.formulas.evaluate.evaluate_rows``)."""
    from engine_advisor.model.queries import evaluate
    m = default_model()
    return [[e.pred.model_dump() for e in evaluate(m, Workload(**spec))] for spec in QUERIES]


def test_compiled_formulas_equal_plain_python():
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    code = ("import json, sys; sys.path.insert(0, 'tests/model'); import test_eval_modes as t; "
            "from numba.core.config import DISABLE_JIT; assert DISABLE_JIT; "
            "print(json.dumps([t.features_of_every_case(), t.evaluations()]))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600, check=True)
    plain, plain_evaluations = json.loads(proc.stdout)
    for got, want in zip(evaluations(), plain_evaluations, strict=True):
        assert len(got) == len(want) > 1
        for g, p in zip(got, want, strict=True):
            np.testing.assert_allclose(list(g.pop("step_terms_s").values()),
                                       list(p.pop("step_terms_s").values()), rtol=1e-12,
                                       atol=1e-15)
            np.testing.assert_allclose(g.pop("interval_s"), p.pop("interval_s"), rtol=1e-12)
            for k in ("total_s", "prefill_s", "decode_s", "tpot_s"):
                np.testing.assert_allclose(g.pop(k), p.pop(k), rtol=1e-12, err_msg=k)
            assert g == p
    compiled = features_of_every_case()
    assert plain.keys() == compiled.keys()
    waves = 0
    for key, want in plain.items():
        got = compiled[key]
        np.testing.assert_allclose(got["X"], want["X"], rtol=1e-12, atol=1e-15, err_msg=key)
        for field in ("running", "capacity", "feasible"):
            np.testing.assert_array_equal(got[field], want[field], err_msg=f"{key} {field}")
        running, feasible = np.array(got["running"]), np.array(got["feasible"])
        waves += int(np.sum(feasible & (running < np.array(got["batch"]))))
    assert waves > 0        # the cases run batches in waves, not only at once


@pytest.mark.parametrize("name", list(SHAPES))
def test_lists_and_arrays_give_the_same_rows(name):
    rows = case_features(random_case(name, "B300", 8, 24, seed=3, as_lists=True))
    arrays = case_features(random_case(name, "B300", 8, 24, seed=3))
    np.testing.assert_array_equal(rows.X, arrays.X)
    np.testing.assert_array_equal(rows.running, arrays.running)


def test_construct_equals_validation():
    m = default_model()
    w = Workload(context_tokens=100_000, output_tokens=512, batch_size=16, preset="kimi-k3")
    ev = evaluate(m, w, [Config("vllm", 1), Config("sglang", 8)])
    for e in ev:
        data = e.pred.model_dump()
        valid = ConfigPrediction.model_validate(data)
        assert valid == e.pred
        assert e.pred.model_dump_json() == valid.model_dump_json()
        assert e.pred.model_fields_set == valid.model_fields_set
    values = {"engine": "vllm", "dcp_size": 1, "mem_fraction": 0.9,
              "mem_fraction_flag": "--gpu-memory-utilization", "mem_flag_value": 0.9,
              "config_file": None, "predictions": [ev[0].pred],
              "speedup": 1.2, "speedup_over": ConfigRef(engine="sglang", dcp_size=8),
              "confidence": "high", "crossover_context_tokens": None,
              "kv_capacity_tokens": 10, "fits_in_memory": True, "launch_command": ["vllm"],
              "reasons": ["r"], "excluded": [Exclusion(engine="sglang", reason="x")],
              "model_version": "v"}
    rec = constructor(Recommendation)(dict(values))
    assert rec == Recommendation.model_validate(values)
    assert rec.model_dump_json() == Recommendation.model_validate(values).model_dump_json()
    # the models constructor() serves take none of what it skips
    for cls in (ConfigPrediction, ConfigRef, Recommendation):
        assert not cls.__private_attributes__ and not cls.__pydantic_post_init__
        assert cls.model_config.get("extra") != "allow"
        assert all(f.alias is None for f in cls.model_fields.values())


def test_to_json_writes_what_pydantic_writes():
    """Byte for byte, over recommendations of many models, GPUs and sizes (waves, exclusions,
    no crossover, transferred and uncalibrated configurations), and a batch answer."""
    from engine_advisor.service.errors import ErrorDetail
    from engine_advisor.service.schemas import BatchItem, BatchResponse
    m = default_model()
    rng = np.random.default_rng(11)
    presets = ["kimi-k3", "llama-3.1-8b", "deepseek-v3", "qwen3-32b", "llama-3.1-405b"]
    items, compared = [], 0
    for i in range(400):
        w = Workload(context_tokens=int(rng.integers(1, 2_000_000)),
                     output_tokens=int(rng.integers(1, 40_000)),
                     batch_size=int(rng.integers(1, 1024)), preset=presets[i % 5],
                     gpu=["B300", "H200", "H100", "B200"][i % 4], num_gpus=[1, 2, 4, 8][i // 4 % 4],
                     allow_extrapolation=True, kv_cache_dtype=["bf16", "fp8"][i // 16 % 2])
        try:
            rec = recommend(m, w, "v")
        except NoEligibleConfiguration:
            continue
        assert to_json(rec) == rec.model_dump_json().encode()
        compared += 1
        items.append(BatchItem(index=i, recommendation=rec))
    assert compared > 100
    items.append(BatchItem(index=1, error=ErrorDetail(message="m", type="t", param=None,
                                                      code=422)))
    batch = BatchResponse(results=items, succeeded=compared, failed=1)
    assert to_json(batch) == batch.model_dump_json().encode()
