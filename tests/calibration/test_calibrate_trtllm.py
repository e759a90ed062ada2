"""TensorRT-LLM in calibration: its start-up log, JSON ``/metrics`` and ``/prometheus/metrics``
as engine facts, and ``calibrate run`` launching the trtllm simulator, then ``fit`` on its rows.

TensorRT-LLM cannot be installed here: the log below is constructed from the format strings in
its source (``tensorrt_llm/_torch/pyexecutor/_util.py``, the C++ KV cache manager,
``py_executor_creator.py``), with values of our own; no real log was seen."""

from __future__ import annotations

import json
import shlex

import httpx
import pytest
from calib_helpers import BIN, cli_in_process

from engine_advisor.calibration.sweep.engine_endpoints import parse_metrics
from engine_advisor.calibration.sweep.engine_logs import parse_log
from engine_advisor.calibration.sweep.engine_sources import command_facts, gather
from engine_advisor.model.fit.artifact import load
from engine_advisor.model.fit.dataset import read_csv
from engine_advisor.sim.config import SimConfig

# constructed from the documented format (see the module docstring), not a captured log
TRTLLM_LOG = """\
[TensorRT-LLM] TensorRT-LLM version: 1.2.0rc5
[12/04/2026-09:12:01] [TRT-LLM] [I] Memory used after loading model weights (inside torch) in \
memory usage profiling: 14.96 GiB
[12/04/2026-09:12:30] [TRT-LLM] [I] Memory dynamically allocated during inference (inside \
torch) in memory usage profiling: 2.41 GiB
[12/04/2026-09:12:30] [TRT-LLM] [I] Memory used outside torch (e.g., NCCL and CUDA graphs) in \
memory usage profiling: 1.87 GiB
[12/04/2026-09:12:30] [TRT-LLM] [I] Peak memory during memory usage profiling (torch + \
non-torch): 19.24 GiB, available KV cache memory when calculating max tokens: 108.47 GiB, \
fraction is set 0.9, kv size is 131072. device total memory 139.81 GiB, , tmp kv_mem 0.50 GiB
[12/04/2026-09:12:30] [TRT-LLM] [I] Estimated max memory in KV cache : 108.47 GiB
[12/04/2026-09:12:31] [TRT-LLM] [W] Attention window size 1048576 exceeds upper bound 888576 \
for available blocks. Reducing to 888576.
[12/04/2026-09:12:31] [TRT-LLM] [W] Adjusted max_seq_len to 888576
[TensorRT-LLM][INFO] KV cache block reuse is enabled
[TensorRT-LLM][INFO] Max KV cache blocks per sequence: 27768 [window size=888576], tokens per \
block=32, primary blocks=27768, secondary blocks=0, max sequence length=888576
[TensorRT-LLM][INFO] Number of tokens per block: 32.
[TensorRT-LLM][INFO] [MemUsageChange] Allocated 108.47 GiB for max tokens in paged KV cache \
(888576).
[12/04/2026-09:12:40] [TRT-LLM] [I] max_seq_len=888576, max_num_requests=256, \
max_num_tokens=8192, max_batch_size=256
"""


def test_the_start_up_log_gives_kv_memory_and_limits():
    f = parse_log("trtllm", TRTLLM_LOG)
    assert (f.kv_cache_gib, f.kv_capacity_tokens) == (108.47, 888_576)
    assert (f.block_size, f.num_gpu_blocks) == (32, 27_768)
    assert (f.weights_gib, f.peak_activation_gib, f.non_torch_gib) == (14.96, 2.41, 1.87)
    assert f.gpu_total_gib == 139.81 and f.version == "1.2.0rc5"
    assert (f.max_model_len, f.max_running) == (888_576, 256)
    assert f.prefix_caching is True
    assert f.mem_fraction is None       # "fraction is set" is of the free memory, not the GPU
    assert f.sources["kv_capacity_tokens"] == "log"


def test_the_simulators_start_up_lines_parse_back_to_its_pool():
    from engine_advisor.sim.engines import trtllm as sim_trtllm

    cfg = SimConfig(engine="trtllm", mem_fraction=0.85, max_running=96)
    pool = cfg.pool()
    lines: list[str] = []

    def log(message, level="INFO", where="x"):
        lines.append(sim_trtllm.ENGINE.log_line(__import__("datetime").datetime.now(), level,
                                                where, message))

    sim_trtllm.ENGINE.startup(log, cfg, pool)
    sim_trtllm.ENGINE.limits(log, cfg, pool, 65536)
    f = parse_log("trtllm", "\n".join(lines))
    assert f.kv_capacity_tokens == pool.capacity_tokens // 32 * 32
    assert f.num_gpu_blocks == pool.capacity_tokens // 32
    assert (f.max_running, f.max_model_len, f.version) == (96, 65536, "1.2.0+sim")
    assert f.gpu_total_gib == pytest.approx(cfg.gpu_spec.memory_bytes / 2**30, abs=0.01)


def _stats(blocks: int, per_block: int, batch: int) -> list[dict]:
    kv = {"maxNumBlocks": blocks, "freeNumBlocks": blocks - 3, "usedNumBlocks": 3,
          "tokensPerBlock": per_block, "allocTotalBlocks": 3, "allocNewBlocks": 3,
          "reusedBlocks": 0, "missedBlocks": 3, "cacheHitRate": 0.0}
    return [{"iter": i, "iterLatencyMS": 9.5, "numActiveRequests": 1, "numQueuedRequests": 0,
             "maxBatchSizeStatic": batch, "kvCacheStats": kv} for i in (7, 8)]


def test_json_and_prometheus_metrics_give_the_kv_blocks():
    f = parse_metrics(json.dumps(_stats(5000, 64, 512)))
    assert (f.kv_capacity_tokens, f.block_size, f.num_gpu_blocks) == (320_000, 64, 5000)
    assert f.max_running == 512 and f.sources["kv_capacity_tokens"] == "metrics"
    assert parse_metrics("[]").empty            # an idle server whose queue was drained
    text = ('# TYPE trtllm_kv_cache_max_blocks gauge\n'
            'trtllm_kv_cache_max_blocks{model_name="undefined",engine_type="undefined"} 27768\n'
            'trtllm_kv_cache_tokens_per_block{model_name="undefined",engine_type="undefined"} 32\n'
            'trtllm_max_batch_size_static{model_name="undefined",engine_type="undefined"} 256\n')
    f = parse_metrics(text)
    assert (f.kv_capacity_tokens, f.max_running) == (888_576, 256)
    # the live sources come first, the log fills the rest
    both = gather("trtllm", metrics=text, log=TRTLLM_LOG)
    assert both.sources["kv_capacity_tokens"] == "metrics" and both.kv_cache_gib == 108.47


def test_the_launch_command_gives_the_running_limit():
    for argv in (["trtllm-serve", "m", "--max_batch_size", "64"],
                 ["trtllm-serve", "m", "--max_batch_size=64"]):
        f = command_facts("trtllm", argv)
        assert (f.max_running_requested, f.max_running) == (64, 64)


SIM = (f"{shlex.quote(str(BIN))} sim --engine trtllm --port {{port}} --dcp-size {{dcp_size}} "
       "--mem-fraction {mem_fraction} --num-gpus {num_gpus} --model-name {model} "
       "--time-scale 0.1 --max-model-len 65536 --max-running 32")


@pytest.mark.slow
def test_calibrate_run_launches_the_trtllm_simulator_and_fit_takes_its_rows(tmp_path):
    r = cli_in_process(
        "calibrate", "run", "--engine", "trtllm", "--launch", SIM, "--model", "kimi-k3",
        "--dcp-sizes", "1", "--mem-fractions", "0.85", "--contexts", "2048,8192",
        "--batch-sizes", "1,4", "--output-tokens", "16", "--kv-bytes-per-token", "70272",
        "--retries", "1", "--stop-grace", "5", "--out", str(tmp_path / "run"), "--no-progress")
    assert r.returncode == 0, r.stderr
    rows = read_csv(tmp_path / "run" / "dataset.csv")
    assert len(rows) == 4
    assert {(x.engine, x.engine_version, x.mem_fraction) for x in rows} == {
        ("trtllm", "1.2.0+sim", 0.85)}
    assert all(x.ttft_s and x.tpot_s and x.total_s and x.errors == 0 for x in rows)
    pool = SimConfig(engine="trtllm", mem_fraction=0.85, model_name="kimi-k3",  # as launched
                     max_model_len=65536, max_running=32).pool()
    cap = pool.capacity_tokens // 32 * 32
    assert {x.kv_capacity_tokens for x in rows} == {cap}
    assert {x.max_running for x in rows} == {32}
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    info = manifest["engines"]["dcp=1,mem=0.85"]
    facts = info["facts"]
    assert facts["kv_capacity_tokens"] == cap and facts["block_size"] == 32
    assert facts["sources"]["kv_capacity_tokens"] == "metrics"     # /prometheus/metrics
    assert facts["kv_cache_gib"] > 0 and facts["sources"]["kv_cache_gib"] == "log"
    assert info["version"] == "1.2.0+sim"
    with pytest.raises(httpx.ConnectError):          # the launched engine was stopped
        httpx.get(info["url"] + "/health", timeout=2)

    fit = cli_in_process("fit", str(tmp_path / "run"), "--out", str(tmp_path / "m.json"),
                         "--kv-bytes-only")
    assert fit.returncode == 0, fit.stderr
    model, _ = load(tmp_path / "m.json")
    assert model.engine_names == ["trtllm"]
    assert "trtllm/B300" in model.engines


@pytest.mark.slow
def test_calibrate_run_against_a_running_trtllm_simulator_reads_its_metrics(tmp_path, sims):
    url = sims.start("trtllm", "--time-scale", "0.1", "--max-model-len", "65536")
    r = cli_in_process("calibrate", "run", "--engine", "trtllm", "--url", url, "--contexts",
                       "4096", "--batch-sizes", "1,2", "--output-tokens", "8",
                       "--kv-bytes-per-token", "70272", "--out", str(tmp_path / "run"),
                       "--no-progress")
    assert r.returncode == 0, r.stderr
    rows = read_csv(tmp_path / "run" / "dataset.csv")
    assert [(x.engine, x.batch_size) for x in rows] == [("trtllm", 1), ("trtllm", 2)]
    cap = SimConfig(engine="trtllm", max_model_len=65536).pool().capacity_tokens // 32 * 32
    assert {x.kv_capacity_tokens for x in rows} == {cap}    # no log: /prometheus/metrics
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    (info,) = manifest["engines"].values()
    assert info["version"] == "1.2.0+sim" and info["info_path"] == "/version"
    assert info["facts"]["sources"]["kv_capacity_tokens"] == "metrics"
