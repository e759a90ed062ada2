"""One capacity: the simulator's KV capacity is the recommender's
(``engine_advisor.model.physics.capacity.instance_pool``), linear-attention state included, for
presets, engines, DCP sizes, GPUs and batches, launched with the memory flags the recommendation
names."""

from __future__ import annotations

import httpx
import pytest
from simproc import SimProcess

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.queries import evaluate
from engine_advisor.model.workload import Workload
from engine_advisor.sim.config import SimConfig

CASES = [  # (preset, gpu, num_gpus, batch)
    ("kimi-k3", "B300", 8, 64),        # 69 linear-attention layers: a 14 GB state pool per GPU
    ("kimi-k3", "B300", 8, 600),       # batch above the 256 default: the pool grows with it
    ("kimi-k3", "GB300", 8, 1),
    ("deepseek-v3", "H200", 8, 16),
    ("llama-3.1-70b", "H100", 8, 8),   # GQA: 8 KV heads split over the 8 ranks
    ("llama-3.1-70b", "B200", 4, 8),
    ("qwen3-32b", "H200", 2, 32),
    ("deepseek-v2-lite", "H200", 1, 4),
]


def recommender_capacities(preset: str, gpu: str, num_gpus: int, batch: int):
    """(engine, dcp, memory fraction, KV capacity, memory flags) of every candidate
    configuration."""
    model = default_model()
    w = Workload(context_tokens=8192, output_tokens=256, batch_size=batch, preset=preset,
                 gpu=gpu, num_gpus=num_gpus)
    return [(e.config.engine, e.config.dcp_size, e.pred.mem_fraction, e.pred.kv_capacity_tokens,
             e.pred.memory_flags) for e in evaluate(model, w)]


def sim_config(*args: str) -> SimConfig:
    """The simulator's settings of an ``engine-advisor sim`` command line (after ``sim``)."""
    from engine_advisor.cli.main import build_parser
    from engine_advisor.cli.sim import config_of

    return config_of(build_parser().parse_args(["sim", "--port", "1", *args]))


@pytest.mark.parametrize(("preset", "gpu", "num_gpus", "batch"), CASES)
def test_simulator_capacity_is_the_recommenders(preset, gpu, num_gpus, batch):
    rows = recommender_capacities(preset, gpu, num_gpus, batch)
    assert {engine for engine, *_ in rows} == {"vllm", "sglang"}
    for engine, dcp, fraction, cap, flags in rows:
        # the engine's own memory flags (Engine.knob_args) are the simulator's too
        cfg = sim_config("--engine", engine, "--model-name", preset, "--gpu", gpu,
                         "--num-gpus", str(num_gpus), "--dcp-size", str(dcp),
                         "--mem-fraction", str(fraction),
                         "--kv-bytes-per-token", str(round(default_model_kv(preset))), *flags)
        assert cfg.problems() == []
        assert cfg.kv_capacity() == cap, (preset, gpu, engine, dcp, fraction, flags)


def default_model_kv(preset: str) -> float:
    return Workload(context_tokens=1, output_tokens=1, preset=preset).model_shape() \
        .kv_bytes_per_token


def test_the_state_pool_is_counted():
    """Kimi-K3's linear-attention state on SGLang: each state slot the pool holds
    (``--max-mamba-cache-size``) takes one request's state bytes from the KV pool, whose
    tokens DCP multiplies."""
    small = SimConfig(engine="sglang", dcp_size=8, mem_fraction=0.92, max_mamba_cache_size=100)
    large = SimConfig(engine="sglang", dcp_size=8, mem_fraction=0.92, max_mamba_cache_size=356)
    state = small.pool().layout.state_bytes
    assert state > 0 and (small.pool().state_slots, large.pool().state_slots) == (100, 356)
    tokens = 256 * state / small.kv_bytes_per_gpu_token * 8
    assert small.kv_capacity() - large.kv_capacity() == pytest.approx(tokens, abs=2 * 8)
    assert (small.pool().max_running, large.pool().max_running) == (100 // 5, 356 // 5)


@pytest.mark.parametrize(("engine", "dcp"), [("sglang", 8), ("vllm", 1)])
def test_a_running_simulator_reports_the_recommenders_capacity(engine, dcp):
    """The issue's example: Kimi-K3 on 8 x B300 at the recommended memory fraction."""
    (fraction, cap, flags), = [(f, c, fl) for e, d, f, c, fl in
                               recommender_capacities("kimi-k3", "B300", 8, 64)
                               if (e, d) == (engine, dcp)]
    with SimProcess("--engine", engine, "--dcp-size", str(dcp), "--mem-fraction", str(fraction),
                    "--time-scale", "0.001", *flags, timeout=120.0) as sim:
        if engine == "sglang":
            info = httpx.get(sim.url + "/get_server_info", timeout=30).json()
            assert info["max_total_num_tokens"] == cap
            assert f"max_total_num_tokens={cap}" in sim.log
        else:
            assert f"GPU KV cache size: {cap:,} tokens" in sim.log
