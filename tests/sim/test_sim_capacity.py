"""One capacity: the simulator's KV capacity is the recommender's
(``model.physics.memory.instance_kv_capacity``), linear-attention state pool included, for presets,
engines, DCP sizes, GPUs and batches."""

from __future__ import annotations

import httpx
import pytest
from simproc import SimProcess

from model.fit.default import default_model
from model.queries import evaluate
from model.workload import Workload
from sim.config import SimConfig

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
    """(engine, dcp, memory fraction, KV capacity) of every candidate configuration."""
    model = default_model()
    w = Workload(context_tokens=8192, output_tokens=256, batch_size=batch, preset=preset,
                 gpu=gpu, num_gpus=num_gpus)
    return [(e.config.engine, e.config.dcp_size, e.pred.mem_fraction, e.pred.kv_capacity_tokens)
            for e in evaluate(model, w)]


@pytest.mark.parametrize(("preset", "gpu", "num_gpus", "batch"), CASES)
def test_simulator_capacity_is_the_recommenders(preset, gpu, num_gpus, batch):
    rows = recommender_capacities(preset, gpu, num_gpus, batch)
    assert {engine for engine, *_ in rows} == {"vllm", "sglang"}
    for engine, dcp, fraction, cap in rows:
        cfg = SimConfig(engine=engine, model_name=preset, gpu=gpu, num_gpus=num_gpus,
                        dcp_size=dcp, mem_fraction=fraction,
                        kv_bytes_per_token=round(default_model_kv(preset)),
                        max_running=max(256, batch))
        assert cfg.problems() == []
        assert cfg.kv_capacity() == cap, (preset, gpu, engine, dcp, fraction)


def default_model_kv(preset: str) -> float:
    return Workload(context_tokens=1, output_tokens=1, preset=preset).model_shape() \
        .kv_bytes_per_token


def test_the_state_pool_is_counted():
    """Kimi-K3's linear-attention state: the capacity at 256 running sequences is below the
    capacity without a pool by exactly the pool's bytes over the KV bytes per GPU token."""
    base = SimConfig(engine="sglang", dcp_size=8, mem_fraction=0.92)
    shape = base.shape()
    assert shape.state_bytes_per_seq > 0
    pool_tokens = shape.state_bytes_per_seq / 8 * 256 / (shape.kv_gpu_token_bytes(8) / 8)
    one = SimConfig(engine="sglang", dcp_size=8, mem_fraction=0.92, max_running=1)
    assert one.kv_capacity() - base.kv_capacity() == pytest.approx(
        pool_tokens * 255 / 256, abs=2)


@pytest.mark.parametrize(("engine", "dcp"), [("sglang", 8), ("vllm", 1)])
def test_a_running_simulator_reports_the_recommenders_capacity(engine, dcp):
    """The issue's example: Kimi-K3 on 8 x B300 at the recommended memory fraction."""
    (fraction, cap), = [(f, c) for e, d, f, c in recommender_capacities("kimi-k3", "B300", 8, 64)
                        if (e, d) == (engine, dcp)]
    with SimProcess("--engine", engine, "--dcp-size", str(dcp), "--mem-fraction", str(fraction),
                    "--time-scale", "0.001", timeout=120.0) as sim:
        if engine == "sglang":
            info = httpx.get(sim.url + "/get_server_info", timeout=30).json()
            assert info["max_total_num_tokens"] == cap
            assert f"max_total_num_tokens={cap}" in sim.log
        else:
            assert f"GPU KV cache size: {cap:,} tokens" in sim.log
