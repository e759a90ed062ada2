"""A workload's query (engine_advisor.model.queries.query_for): gathered once per workload without
its sizes, shared by every size of it, and new whenever something a prediction depends on
changes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from engine_advisor.model import engines
from engine_advisor.model.engines import vllm
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.hardware.profiles import clear_profile_cache
from engine_advisor.model.queries import evaluate, query_for
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Config, Workload

QWEN = json.loads((Path(__file__).parents[1] / "data" / "qwen2.5-72b-config.json").read_text())
KIMI = dict(context_tokens=65_536, output_tokens=1024, batch_size=8, preset="kimi-k3")


def test_every_size_of_a_workload_is_one_query():
    m = default_model()
    w = Workload(**KIMI)
    q = query_for(m, w)
    for change in ({"context_tokens": 200_000}, {"batch_size": 3}, {"output_tokens": 7},
                   {"model": "moonshotai/Kimi-K3"}):
        assert query_for(m, w.model_copy(update=change)) is q, change
    # the launch command is the request's, not the query's
    rec = recommend(m, w.model_copy(update={"model": "my/kimi"}), "v")
    assert "my/kimi" in rec.launch_command
    assert "my/kimi" not in recommend(m, w, "v").launch_command


def test_what_a_prediction_depends_on_makes_a_new_query():
    m = default_model()
    w = Workload(**KIMI)
    q = query_for(m, w)
    for change in ({"gpu": "H200"}, {"num_gpus": 4}, {"kv_cache_dtype": "fp8"},
                   {"engines": ["vllm"]}, {"dcp_sizes": [1, 8]},
                   {"allow_extrapolation": True}, {"model_weight_bytes": 1e12},
                   {"requirements": {"prefix_reuse_share": 0.5}}):
        other = Workload.model_validate({**w.model_dump(exclude_none=True), **change})
        assert query_for(m, other) is not q, change
    assert query_for(m, w, [Config("vllm", 1)]) is not q
    assert query_for(m, w, [Config("vllm", 1)]).configs == (Config("vllm", 1),)


def test_a_config_json_s_model_name_is_its_calibration_key():
    """With ``hf_config``, ``model`` names the shape whose calibration data applies."""
    m = default_model()
    a = Workload(context_tokens=8192, output_tokens=128, hf_config=QWEN, model="a/qwen",
                 gpu="H200")
    b = a.model_copy(update={"model": "b/qwen"})
    qa, qb = query_for(m, a), query_for(m, b)
    assert qa is not qb and qa.shape.key != qb.shape.key
    assert query_for(m, a.model_copy(update={"context_tokens": 100})) is qa


def test_reloaded_profiles_and_registered_engines_make_new_queries(monkeypatch):
    m = default_model()
    w = Workload(**KIMI)
    q = query_for(m, w)
    clear_profile_cache()                      # profiles re-read: new silicon
    q2 = query_for(m, w)
    assert q2 is not q and q2.si is not q.si
    fake = dataclasses.replace(vllm.ENGINE, name="fake2", program=("fake-serve",))
    monkeypatch.setitem(engines.REGISTRY, "fake2", fake)
    assert {c.engine for c in query_for(m, w).configs} == {"vllm", "sglang", "fake2"}
    assert {e.config.engine for e in evaluate(m, w)} == {"vllm", "sglang", "fake2"}
