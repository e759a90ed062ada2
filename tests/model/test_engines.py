"""The engine registry: every module registered and complete, its launch commands the ones the
recommendations print, and an engine added through the registry recommended end to end."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engine_advisor.model import engines
from engine_advisor.model.engines import vllm
from engine_advisor.model.engines.base import Engine, MemoryKnobs
from engine_advisor.model.fit.default import default_model
from engine_advisor.model.presentation.launch import launch_command
from engine_advisor.model.recommend import recommend
from engine_advisor.model.workload import Workload
from engine_advisor.sim import engines as sim_engines

ENGINE_DIR = Path(engines.__file__).parent
OPTIONAL = {"flag_fraction", "config_flag", "config_path", "config_file", "parallel_args",
            "dcp_gpu_families", "dcp_note", "uncalibrated_note", "kernel_priors", "moe_kernel",
            "family_priors"}


def test_every_engine_module_is_registered_under_its_name():
    modules = {p.stem for p in ENGINE_DIR.glob("*.py")} - {"__init__", "base"}
    assert modules == set(engines.names()) == {"vllm", "sglang", "trtllm"}
    for name in engines.names():
        assert engines.get(name).name == name


def test_every_engine_fills_every_field():
    for name in engines.names():
        e = engines.get(name)
        for f in dataclasses.fields(Engine):
            value = getattr(e, f.name)
            # optional: a positional model argument, knobs beyond the running limit, and the
            # hooks of engines unlike vLLM and SGLang (a free-memory flag, a config file, DCP
            # ranks beside TP, DCP on some GPUs only, no calibration possible)
            if f.name in OPTIONAL:
                continue
            assert value is not None or f.name == "model_flag", (name, f.name)
            if isinstance(value, str | tuple | frozenset) and f.name not in (
                    "knob_flags", "prefill_graph_attention"):
                assert value, (name, f.name)
        assert e.state_layout is not None and e.default_running(141.0) >= 256
        assert all(getattr(e.metrics, f.name) for f in dataclasses.fields(e.metrics))
        assert all(n.startswith(e.metrics.prefixes) for n in (e.metrics.running,
                                                              e.metrics.kv_usage))
        assert e.mem_flag.startswith("--") and e.reserve_bytes > 0
        # a configuration file is named by a flag and a path, and has content
        assert bool(e.config_flag) == bool(e.config_path) == (e.config_file is not None)
        assert e.dcp_attention <= {"mla", "gqa", "mha"} and "mla" in e.dcp_attention
        assert 0 < e.port < 65536


def test_unknown_engine_names_the_known_ones():
    with pytest.raises(KeyError, match="unknown engine 'lmdeploy'; known: vllm, sglang, trtllm"):
        engines.get("lmdeploy")


# what recommendations printed before the flags moved into model/engines
PRINTED = {
    ("vllm", 1, False): ["vllm", "serve", "MODEL", "--tensor-parallel-size", "8",
                         "--gpu-memory-utilization", "0.92"],
    ("vllm", 8, True): ["vllm", "serve", "moonshotai/Kimi-K3", "--tensor-parallel-size", "8",
                        "--decode-context-parallel-size", "8", "--gpu-memory-utilization",
                        "0.92", "--max-num-seqs", "512", "--kv-cache-dtype", "fp8"],
    ("sglang", 1, False): ["python", "-m", "sglang.launch_server", "--model-path", "MODEL",
                           "--tp", "8", "--mem-fraction-static", "0.92"],
    ("sglang", 8, True): ["python", "-m", "sglang.launch_server", "--model-path",
                          "moonshotai/Kimi-K3", "--tp", "8", "--dcp-size", "8",
                          "--mem-fraction-static", "0.92", "--max-running-requests", "512",
                          "--kv-cache-dtype", "fp8_e4m3"],
    # TensorRT-LLM: the flag's value is what Engine.launch_command is given (the free-memory
    # share is converted before it, tests/model/test_trtllm.py); world = tp x cp (Helix); the
    # KV dtype lives in the --config file
    ("trtllm", 1, False): ["trtllm-serve", "MODEL", "--tp_size", "8",
                           "--kv_cache_free_gpu_memory_fraction", "0.92", "--config",
                           "/etc/trtllm/extra-llm-api-config.yml"],
    ("trtllm", 8, True): ["trtllm-serve", "moonshotai/Kimi-K3", "--tp_size", "1", "--cp_size",
                          "8", "--kv_cache_free_gpu_memory_fraction", "0.92",
                          "--max_batch_size", "512", "--config",
                          "/etc/trtllm/extra-llm-api-config.yml"],
}


@pytest.mark.parametrize("engine,dcp,big", list(PRINTED))
def test_launch_commands_are_the_ones_recommendations_printed(engine, dcp, big):
    kw = dict(model="moonshotai/Kimi-K3", batch_size=512, kv_cache_dtype="fp8") if big else {}
    w = Workload(context_tokens=1000, output_tokens=10, preset="kimi-k3", **kw)
    e = engines.get(engine)
    flags = e.knob_args(MemoryKnobs(max_running=512)) if big else []
    assert launch_command(engine, dcp, 0.92, w, flags) == PRINTED[(engine, dcp, big)]
    # with the model's shape, vLLM's and SGLang's flags take the fraction as it is
    if engine != "trtllm":
        assert launch_command(engine, dcp, 0.92, w, flags,
                              w.model_shape()) == PRINTED[(engine, dcp, big)]
    assert e.launch_command(w.model or "MODEL", 8, dcp, 0.92, flags,
                            w.kv_cache_dtype) == PRINTED[(engine, dcp, big)]


def test_memory_knobs_are_each_engines_flags():
    knobs = MemoryKnobs(max_running=40, state_slots=200, no_prefix_cache=True, state_ratio=0.5)
    assert engines.get("sglang").knob_args(knobs) == [
        "--disable-radix-cache", "--max-mamba-cache-size", "200",
        "--mamba-full-memory-ratio", "0.5", "--max-running-requests", "40"]
    # vLLM's one memory knob here is its running-sequence limit
    assert engines.get("vllm").knob_args(knobs) == ["--max-num-seqs", "40"]
    assert engines.get("vllm").knob_args(MemoryKnobs()) == []
    assert engines.get("trtllm").knob_args(knobs) == ["--max_batch_size", "40"]


def test_a_recommendation_prints_its_engines_command_and_flag():
    m = default_model()
    rec = recommend(m, Workload(context_tokens=204_800, output_tokens=2048, batch_size=64,
                                preset="kimi-k3"), m.version)
    e = engines.get(rec.engine)
    assert rec.mem_fraction_flag == e.mem_flag
    best = next(p for p in rec.predictions
                if (p.engine, p.dcp_size) == (rec.engine, rec.dcp_size))
    assert rec.launch_command == e.launch_command("MODEL", 8, rec.dcp_size, rec.mem_fraction,
                                                  best.memory_flags)


@pytest.mark.parametrize("engine,attention,kv_heads,tp,dcp,why", [
    ("vllm", "mla", 1, 8, 8, None),
    ("sglang", "mla", 1, 8, 8, None),
    ("vllm", "gqa", 8, 8, 2, "vLLM needs (tp // kv_heads) % dcp == 0: KV heads 8 on tp 8 are "
                             "replicated 1x, so dcp 2 cannot stripe them"),
    ("vllm", "gqa", 2, 8, 4, None),
    ("sglang", "gqa", 2, 8, 4, "SGLang implements DCP for MLA attention only; this model uses "
                               "GQA"),
    ("sglang", "mla", 1, 8, 3, "dcp 3 does not divide the tensor-parallel size 8"),
    ("sglang", "unknown", 0, 8, 8, None),
    # TensorRT-LLM's DCP is Helix: MLA models on Blackwell only
    ("trtllm", "mla", 1, 8, 8, None),
    ("trtllm", "mla", 1, 8, 1, None),
    ("trtllm", "gqa", 2, 8, 4, "TensorRT-LLM implements DCP for MLA attention only; this model "
                               "uses GQA"),
])
def test_dcp_constraints_per_engine(engine, attention, kv_heads, tp, dcp, why):
    assert engines.get(engine).dcp_constraint(dcp, tp, attention, kv_heads,
                                              "blackwell") == why
    # vLLM's and SGLang's DCP runs on any GPU
    if engine != "trtllm" or dcp == 1:
        assert engines.get(engine).dcp_constraint(dcp, tp, attention, kv_heads, "hopper") == why


def test_trtllm_runs_dcp_on_blackwell_only():
    e = engines.get("trtllm")
    assert e.dcp_constraint(8, 8, "mla", 1, "hopper") == (
        "TensorRT-LLM runs DCP > 1 on blackwell GPUs only; this GPU is hopper")
    assert e.dcp_constraint(8, 8, "mla", 1) == (
        "TensorRT-LLM runs DCP > 1 on blackwell GPUs only; this GPU is of an unknown family")
    # Helix needs MLA: a model known only by its KV bytes per token gets none
    assert e.dcp_constraint(8, 8, "unknown", 0, "blackwell") == (
        "TensorRT-LLM's DCP > 1 runs on mla attention only, and this model's attention is "
        "unknown (only its KV bytes per token are given)")
    assert e.dcp_constraint(1, 8, "unknown", 0, "hopper") is None


def test_every_engine_has_a_simulator_engine():
    assert sim_engines.names() == engines.names()
    for name in engines.names():
        assert sim_engines.get(name).engine is engines.get(name)


def test_an_engine_added_to_the_registry_is_recommended_end_to_end(monkeypatch):
    """A third engine, registered like the others: considered, predicted from the physics
    priors (uncalibrated), and when it is the only one, recommended with its own launch
    command, memory flag and reserve."""
    fake = dataclasses.replace(vllm.ENGINE, name="fake", label="Fake", program=("fake-serve",),
                               tp_flag="--tp", mem_flag="--fake-memory", reserve_bytes=5 * 2**30,
                               dcp_attention=frozenset({"mla"}))
    monkeypatch.setitem(engines.REGISTRY, "fake", fake)
    m = default_model()
    w = Workload(context_tokens=65_536, output_tokens=256, batch_size=8, preset="kimi-k3",
                 allow_extrapolation=True)
    rec = recommend(m, w, m.version)
    fakes = [p for p in rec.predictions if p.engine == "fake"]
    assert {p.dcp_size for p in fakes} == {1, 2, 4, 8}
    assert all(not p.calibrated for p in fakes)
    # the same configuration under vLLM's rules but 5 GiB more reserve holds fewer tokens
    v = {p.dcp_size: p.kv_capacity_tokens for p in rec.predictions if p.engine == "vllm"}
    assert all(p.kv_capacity_tokens < v[p.dcp_size] for p in fakes)

    monkeypatch.setattr(engines, "REGISTRY", {"fake": fake})
    alone = recommend(m, w, m.version)
    assert (alone.engine, alone.mem_fraction_flag) == ("fake", "--fake-memory")
    assert alone.launch_command[:3] == ["fake-serve", "MODEL", "--tp"]
    assert "--fake-memory" in alone.launch_command
