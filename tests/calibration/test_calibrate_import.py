"""Importing vllm bench serve JSON and SGLang bench_serving JSONL files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from calib_helpers import cli_in_process

from calibration.importers import BenchFileError, Defaults, import_files
from model.dataset import read_csv

DATA = Path(__file__).parent / "data"
VLLM = DATA / "vllm_bench_8k_c8.json"
VLLM_SUMMARY = DATA / "vllm_bench_32k_c4_summary.json"
SGLANG = DATA / "sglang_bench_16k.jsonl"
D = Defaults(kv_bytes_per_token=70272, mem_fraction=0.92)


def test_vllm_file_with_per_request_arrays():
    (row,) = import_files([str(VLLM)], "vllm-bench", D)
    raw = json.loads(VLLM.read_text())
    assert (row.engine, row.context_tokens, row.output_tokens, row.batch_size) == ("vllm", 8192,
                                                                                  64, 8)
    assert row.total_s == raw["duration"]
    assert row.ttft_s == max(raw["ttfts"])        # the batch's prefill: the last first token
    tpots = [sum(g) / 63 for g in raw["itls"]]
    assert row.tpot_s == pytest.approx(sum(tpots) / len(tpots))
    assert row.tpot_s * 1e3 == pytest.approx(raw["mean_tpot_ms"], rel=1e-9)  # same definition
    assert row.source == "import:vllm-bench:vllm_bench_8k_c8.json:1"
    assert row.mem_fraction == 0.92 and row.kv_bytes_per_token == 70272


def test_vllm_summary_file_of_several_waves_gives_tpot_only():
    (row,) = import_files([str(VLLM_SUMMARY)], "vllm-bench", D)
    assert (row.context_tokens, row.output_tokens, row.batch_size) == (32768, 128, 4)
    assert row.tpot_s == pytest.approx(0.0246)
    assert row.total_s is None and row.ttft_s is None


def test_sglang_jsonl_lines_become_rows():
    rows = import_files([str(SGLANG)], "sglang-bench", Defaults(kv_bytes_per_token=70272,
                                                                 dcp_size=8))
    assert [(r.engine, r.dcp_size, r.context_tokens, r.output_tokens, r.batch_size)
            for r in rows] == [("sglang", 8, 16384, 128, 1), ("sglang", 8, 16384, 128, 4)]
    lines = [json.loads(s) for s in SGLANG.read_text().splitlines()]
    assert rows[0].tpot_s == pytest.approx(lines[0]["mean_tpot_ms"] / 1e3)
    assert rows[0].ttft_s == pytest.approx(lines[0]["p99_ttft_ms"] / 1e3)
    assert rows[1].ttft_s == max(lines[1]["ttfts"])
    assert [r.source for r in rows] == ["import:sglang-bench:sglang_bench_16k.jsonl:1",
                                        "import:sglang-bench:sglang_bench_16k.jsonl:2"]


def test_cli_import_writes_and_appends(tmp_path):
    out = tmp_path / "imported.csv"
    r = cli_in_process("calibrate", "import", "--format", "vllm-bench", str(VLLM),
                       str(VLLM_SUMMARY), "--kv-bytes-per-token", "70272", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "imported 2 rows" in r.stdout
    r = cli_in_process("calibrate", "import", "--format", "sglang-bench", str(SGLANG),
                       "--dcp-size", "8", "--kv-bytes-per-token", "70272", "--out", str(out))
    assert r.returncode == 2 and "exists; use --append" in r.stderr
    r = cli_in_process("calibrate", "import", "--format", "sglang-bench", str(SGLANG),
                       "--dcp-size", "8", "--kv-bytes-per-token", "70272", "--out", str(out),
                       "--append")
    assert r.returncode == 0, r.stderr
    rows = read_csv(out)
    assert [r.engine for r in rows] == ["vllm", "vllm", "sglang", "sglang"]
    fit = cli_in_process("fit", str(out), "--out", str(tmp_path / "m.joblib"))
    assert fit.returncode == 0, fit.stderr


def _corrupt_jsonl(tmp_path: Path) -> Path:
    lines = SGLANG.read_text().splitlines()
    bad = tmp_path / "bench.jsonl"
    bad.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2] + "\n")
    return bad


@pytest.mark.parametrize("fmt, make, where, message", [
    ("sglang-bench", _corrupt_jsonl, "bench.jsonl:2", "not valid JSON"),
    ("vllm-bench", lambda t: _write(t, "b.json", VLLM.read_text()[:-40]), "b.json:",
     "not valid JSON"),
    ("vllm-bench", lambda t: _edit(t, "completed", 0), "b.json:1",
     "'completed' must be a positive"),
    ("vllm-bench", lambda t: _edit(t, "duration", None), "b.json:1", "missing field 'duration'"),
    ("vllm-bench", lambda t: _edit(t, "ttfts", [0.1]), "b.json:1",
     "'ttfts' has 1 entries, expected 8"),
    ("vllm-bench", lambda t: _edit(t, "duration", "fast"), "b.json:1",
     "'duration' must be a number"),
    ("sglang-bench", lambda t: _write(t, "b.jsonl", "[1, 2]\n"), "b.jsonl:1",
     "expected a JSON object"),
])
def test_malformed_files_name_file_and_line_and_write_nothing(tmp_path, fmt, make, where,
                                                              message):
    bad = make(tmp_path)
    out = tmp_path / "out.csv"
    # a good file first: even its rows must not be written when a later file is bad
    good = str(VLLM if fmt == "vllm-bench" else SGLANG)
    r = cli_in_process("calibrate", "import", "--format", fmt, good, str(bad),
                       "--kv-bytes-per-token", "70272", "--out", str(out))
    assert r.returncode == 2
    assert r.stderr.startswith(f"engine-advisor: error: {tmp_path}/{where}")
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
    with pytest.raises(BenchFileError):
        import_files([str(bad)], fmt, D)


def test_append_to_a_bad_csv_leaves_it_untouched(tmp_path):
    out = tmp_path / "out.csv"
    out.write_text("not,a,dataset\n")
    r = cli_in_process("calibrate", "import", "--format", "vllm-bench", str(VLLM),
                       "--kv-bytes-per-token", "70272", "--out", str(out), "--append")
    assert r.returncode == 2 and f"{out}:1: header lacks required columns" in r.stderr
    assert out.read_text() == "not,a,dataset\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _edit(tmp_path: Path, key: str, value) -> Path:
    obj = json.loads(VLLM.read_text())
    if value is None:
        del obj[key]
    else:
        obj[key] = value
    p = tmp_path / "b.json"
    shutil.copy(VLLM, p)
    p.write_text(json.dumps(obj, indent=2))
    return p
