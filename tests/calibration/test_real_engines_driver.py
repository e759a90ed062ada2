"""bench/real_engines/run.py, the driver of the real-engine measurements, against the simulator
in place of vLLM: it writes a model folder, serves it, sweeps it with the preset, dummy weights
and the engine's log, and saves the engine's facts."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
from calib_helpers import BIN, REPO
from proc import free_port

from engine_advisor.model.fit.dataset import read_csv


@pytest.mark.slow
def test_the_driver_sweeps_a_served_model_with_its_preset(tmp_path):
    res = tmp_path / "res"
    sim = (f"{shlex.quote(str(BIN))} sim --engine vllm --port {{port}} --model-name {{preset}} "
           "--kv-bytes-per-token {kv} --gpu H200 --num-gpus 1 --time-scale 0.2 "
           "--max-model-len {max_len}")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "real_engines" / "run.py"), "all",
                        "--res", str(res), "--only", "vllm-llama-3.1-8b", "--engine-cmd", sim,
                        "--port", str(free_port()), "--startup-timeout", "60",
                        "--grid", "1024:1,2"],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "FAILED" not in r.stdout, r.stdout
    assert (res / "models" / "llama-3.1-8b" / "config.json").exists()
    folder = res / "runs" / "vllm-llama-3.1-8b" / "ctx1024"
    rows = read_csv(folder / "dataset.csv")
    assert [r.batch_size for r in rows] == [1, 2]
    for row in rows:
        assert (row.model, row.kv_bytes_per_token, row.weights) == ("llama-3.1-8b", 131072,
                                                                    "dummy")
        assert row.decode_step_s is not None and row.kv_capacity_tokens
    manifest = json.loads((folder / "manifest.json").read_text())
    record = manifest["engines"]["dcp=1,mem=0.9"]
    assert record["engine_log"].endswith("logs/vllm-llama-3.1-8b.log")
    assert record["facts"]["sources"]["kv_cache_gib"] == "log"
    events = [json.loads(s) for s in (folder / "events.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "warmup" and "jit" not in kinds
    assert (res / "logs" / "vllm-llama-3.1-8b.metrics.txt").read_text().startswith("#")


@pytest.mark.slow
def test_the_dcp_plan_serves_each_dcp_size_at_tp_n(tmp_path):
    """--tp N (issue 27): deepseek-v2-lite at TP N, one folder per engine and DCP size, rows
    that record the GPU count and DCP size (here the simulator stands in for both engines)."""
    res = tmp_path / "res"
    sim = (f"{shlex.quote(str(BIN))} sim --engine {{engine}} --port {{port}} "
           "--model-name {preset} --kv-bytes-per-token {kv} --gpu H200 --num-gpus {tp} "
           "--dcp-size {dcp} --time-scale 0.2 --max-model-len {max_len}")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "real_engines" / "run.py"), "all",
                        "--res", str(res), "--tp", "8", "--dcp-sizes", "1,8",
                        "--engine-cmd", sim, "--port", str(free_port()),
                        "--startup-timeout", "60", "--grid", "8192:1,8"],
                       capture_output=True, text=True, timeout=900, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "FAILED" not in r.stdout, r.stdout
    for engine in ("vllm", "sglang"):
        for dcp in (1, 8):
            folder = res / "runs" / f"{engine}-deepseek-v2-lite-tp8-dcp{dcp}" / "ctx8192"
            rows = read_csv(folder / "dataset.csv")
            assert [(x.num_gpus, x.dcp_size, x.batch_size) for x in rows] == [
                (8, dcp, 1), (8, dcp, 8)]
