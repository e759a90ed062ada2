"""``calibrate import`` of TensorRT-LLM's benchmark files: ``benchmark_serving``'s JSON
(``--format trtllm-serving``) and ``trtllm-bench --report_json`` (``--format trtllm-bench``).

The two files under data/ are constructed from the formats in TensorRT-LLM's source
(``tensorrt_llm/serve/scripts/benchmark_serving.py``, ``tensorrt_llm/bench/dataclasses/
reporting.py``) with values of our own (their ``_comment`` says so): TensorRT-LLM cannot be
installed here, so no captured file exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calib_helpers import cli_in_process

from engine_advisor.calibration.sweep.importers import BenchFileError, Defaults, import_files
from engine_advisor.model.fit.dataset import read_csv

DATA = Path(__file__).parent / "data"
SERVING = DATA / "trtllm_serving_8k_c4.json"
BENCH = DATA / "trtllm_bench_report.json"
D = Defaults(gpu="H200", kv_bytes_per_token=131072)


def test_benchmark_serving_json_is_a_trtllm_row_with_its_arrays():
    (row,) = import_files([str(SERVING)], "trtllm-serving", D)
    obj = json.loads(SERVING.read_text())
    assert row.engine == "trtllm"               # backend "openai": the format says which
    assert (row.context_tokens, row.output_tokens, row.batch_size) == (8192, 64, 4)
    assert row.total_s == pytest.approx(obj["duration"])
    assert row.ttft_s == pytest.approx(max(obj["ttfts"]))   # no send times: the last TTFT
    tpots = [sum(g) / 63 for g in obj["itls"]]
    assert row.tpot_s == pytest.approx(sum(tpots) / 4)
    assert row.decode_step_s == pytest.approx(0.0118, abs=0.0005)
    assert row.source == "import:trtllm-serving:trtllm_serving_8k_c4.json:1"


def test_trtllm_bench_report_is_one_wave_row():
    (row,) = import_files([str(BENCH)], "trtllm-bench", D)
    assert (row.engine, row.engine_version, row.num_gpus) == ("trtllm", "1.2.0rc5", 1)
    assert (row.context_tokens, row.output_tokens, row.batch_size) == (2048, 256, 16)
    assert row.total_s == pytest.approx(4.8732)
    assert row.ttft_s == pytest.approx(0.6119)        # p99 of 16: the last first token
    assert row.tpot_s == pytest.approx(0.01647)
    assert row.max_running == 64                      # --max_batch_size as launched
    assert row.decode_step_s is None                  # 16 requests, no per-request arrays
    assert row.mem_fraction == 0.9                    # not kv_cache_percentage (free memory)


def _edit(tmp_path: Path, change) -> Path:
    obj = json.loads(BENCH.read_text())
    change(obj)
    p = tmp_path / "report.json"
    p.write_text(json.dumps(obj, indent=2))
    return p


def test_more_requests_than_the_batch_limit_need_the_batch_size(tmp_path):
    def many(o):
        o["request_info"]["num_requests"] = 100
    p = _edit(tmp_path, many)
    with pytest.raises(BenchFileError, match=r"report\.json:1: 100 requests over max_batch_size "
                                             r"64.*--batch-size"):
        import_files([str(p)], "trtllm-bench", D)
    (row,) = import_files([str(p)], "trtllm-bench", Defaults(gpu="H200", batch_size=64,
                                                             kv_bytes_per_token=131072))
    assert row.batch_size == 64 and row.total_s is None and row.ttft_s is None   # several waves
    assert row.tpot_s == pytest.approx(0.01647)


@pytest.mark.parametrize("change, message", [
    (lambda o: o.pop("performance"), "field 'performance' must be an object"),
    (lambda o: o["performance"].update(total_latency_ms="slow"),
     "field performance.total_latency_ms must be a non-negative number"),
    (lambda o: o["request_info"].update(num_requests=0),
     "field request_info.num_requests must be a positive integer"),
])
def test_a_bad_report_names_the_field_and_writes_nothing(tmp_path, change, message):
    p = _edit(tmp_path, change)
    out = tmp_path / "rows.csv"
    r = cli_in_process("calibrate", "import", "--format", "trtllm-bench", str(p), "--out",
                       str(out), "--gpu", "H200", "--kv-bytes-per-token", "131072")
    assert r.returncode != 0 and message in r.stderr and "report.json:1" in r.stderr
    assert not out.exists()


def test_cli_writes_both_formats(tmp_path):
    out = tmp_path / "rows.csv"
    r = cli_in_process("calibrate", "import", "--format", "trtllm-bench", str(BENCH), "--out",
                       str(out), "--gpu", "H200", "--kv-bytes-per-token", "131072")
    assert r.returncode == 0, r.stderr
    r = cli_in_process("calibrate", "import", "--format", "trtllm-serving", str(SERVING),
                       "--out", str(out), "--append", "--gpu", "H200", "--kv-bytes-per-token",
                       "131072")
    assert r.returncode == 0, r.stderr
    rows = read_csv(out)
    assert [(x.engine, x.batch_size) for x in rows] == [("trtllm", 16), ("trtllm", 4)]
