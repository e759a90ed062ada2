"""Importing vllm bench serve JSON and SGLang bench_serving JSONL files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from calib_helpers import cli_in_process

from engine_advisor.calibration.sweep.importers import BenchFileError, Defaults, import_files
from engine_advisor.model.fit.dataset import read_csv

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


def test_vllm_start_times_give_the_batch_ttft_from_its_first_send(tmp_path):
    """With ``start_times`` (``--save-detailed``) TTFT is counted as ``calibrate run`` counts
    it: from the batch's first send to its last first token, not from each request's own send
    (a request sent 5 ms late with a 1.0 s TTFT ends the batch's prefill at 1.005 s)."""
    obj = json.loads(VLLM.read_text())
    obj["ttfts"] = [0.9] * 7 + [1.0]
    obj["start_times"] = [100.0] * 7 + [100.005]
    p = tmp_path / "s.json"
    p.write_text(json.dumps(obj))
    (row,) = import_files([str(p)], "vllm-bench", D)
    assert row.ttft_s == pytest.approx(1.005)
    obj["start_times"][3] = None
    p.write_text(json.dumps(obj))
    with pytest.raises(BenchFileError, match="'start_times' must hold numbers"):
        import_files([str(p)], "vllm-bench", D)


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
    fit = cli_in_process("fit", str(out), "--out", str(tmp_path / "m.json"), "--kv-bytes-only")
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


# ----------------------------------------------------------------- what the files say
def _vllm_appended(tmp_path: Path) -> Path:
    """Two runs as ``vllm bench serve --append-result --metadata version=...`` leaves them."""
    first = json.loads(VLLM.read_text())
    second = {**first, "max_concurrency": 4, "num_prompts": 8}
    for k in ("input_lens", "output_lens", "ttfts", "itls", "errors", "generated_texts"):
        second.pop(k, None)
    first["version"] = second["version"] = "0.33.0"
    p = tmp_path / "appended.json"
    p.write_text(json.dumps(first) + "\n" + json.dumps(second))
    return p


def _sglang_with_server_info(tmp_path: Path, **changes) -> Path:
    info = {"tp_size": 8, "dcp_size": 8, "mem_fraction_static": 0.88, "version": "0.5.23",
            "max_total_num_tokens": 3_000_000, "internal_states": [{}]}
    info.update(changes)
    lines = [json.loads(s) for s in SGLANG.read_text().splitlines()]
    p = tmp_path / "sg.jsonl"
    p.write_text("".join(json.dumps({**o, "server_info": info}) + "\n" for o in lines))
    return p


def test_vllm_append_result_lines_and_metadata(tmp_path):
    rows = import_files([str(_vllm_appended(tmp_path))], "vllm-bench",
                        Defaults(kv_bytes_per_token=70272))
    assert [r.source.rsplit(":", 1)[1] for r in rows] == ["1", "2"]
    assert [r.batch_size for r in rows] == [8, 4]        # max_concurrency of the second run
    assert [r.engine_version for r in rows] == ["0.33.0", "0.33.0"]
    assert rows[1].total_s is None and rows[1].tpot_s == pytest.approx(0.0184077, rel=1e-4)


def test_sglang_server_info_fills_the_rows(tmp_path):
    rows = import_files([str(_sglang_with_server_info(tmp_path))], "sglang-bench",
                        Defaults(kv_bytes_per_token=70272))
    assert {(r.num_gpus, r.dcp_size, r.mem_fraction, r.engine_version) for r in rows} == {
        (8, 8, 0.88, "0.5.23")}


def test_a_flag_contradicting_the_file_is_an_error_unless_overridden(tmp_path):
    f = _sglang_with_server_info(tmp_path)
    out = tmp_path / "out.csv"
    base = ["calibrate", "import", "--format", "sglang-bench", str(f), "--kv-bytes-per-token",
            "70272", "--out", str(out)]
    r = cli_in_process(*base, "--dcp-size", "1")
    assert r.returncode == 2 and not out.exists()
    assert "--dcp-size 1 contradicts the file, which says 8" in r.stderr
    r = cli_in_process(*base, "--engine-version", "0.5.9")
    assert r.returncode == 2 and "--engine-version 0.5.9" in r.stderr and "0.5.23" in r.stderr
    agree = cli_in_process(*base, "--dcp-size", "8", "--mem-fraction", "0.88")
    assert agree.returncode == 0, agree.stderr
    out.unlink()
    r = cli_in_process(*base, "--dcp-size", "1", "--override")
    assert r.returncode == 0, r.stderr
    assert {row.dcp_size for row in read_csv(out)} == {1}


def test_a_batch_larger_than_the_kv_capacity_warns(tmp_path, capsys):
    f = _sglang_with_server_info(tmp_path, max_total_num_tokens=20_000)
    rows = import_files([str(f)], "sglang-bench", Defaults(kv_bytes_per_token=70272))
    assert len(rows) == 2
    err = capsys.readouterr().err
    assert "sg.jsonl:2: 4 sequences of 16384 + 128 tokens need more KV than the server's " \
           "capacity of 20000 tokens" in err
    assert "sg.jsonl:1:" not in err                 # one sequence fits


def test_sglang_server_info_gives_the_running_limit_as_launched(tmp_path, capsys):
    """``max_running_requests`` of the server arguments: the limit as launched (None: SGLang's
    default, an empty cell); a batch above it warns."""
    rows = import_files([str(_sglang_with_server_info(tmp_path))], "sglang-bench",
                        Defaults(kv_bytes_per_token=70272))
    assert {r.max_running for r in rows} == {None}
    f = _sglang_with_server_info(tmp_path, max_running_requests=2, internal_states=[
        {"max_running_requests": 2, "effective_max_running_requests_per_dp": 2}])
    rows = import_files([str(f)], "sglang-bench", Defaults(kv_bytes_per_token=70272))
    assert [(r.batch_size, r.max_running) for r in rows] == [(1, 2), (4, 2)]
    err = capsys.readouterr().err
    assert "sg.jsonl:2: batch 4 exceeds the server's max_running_requests 2: at most 2 ran " \
           "at once" in err and "sg.jsonl:1:" not in err
    bad = _sglang_with_server_info(tmp_path, max_running_requests=0)
    with pytest.raises(BenchFileError, match=r"sg.jsonl:1: server_info.max_running_requests: "
                                             r"expected a positive integer, got 0"):
        import_files([str(bad)], "sglang-bench", Defaults(kv_bytes_per_token=70272))


def test_bad_server_info_names_the_field(tmp_path):
    f = _sglang_with_server_info(tmp_path, dcp_size="eight")
    with pytest.raises(BenchFileError, match=r"sg.jsonl:1: server_info.dcp_size: expected a "
                                             r"positive integer, got 'eight'"):
        import_files([str(f)], "sglang-bench", Defaults(kv_bytes_per_token=70272))


def test_times_measured_against_the_simulator_near_its_overhead_warn(tmp_path, capsys):
    res = {"request_overhead_s": 0.005, "token_overhead_s": 0.0001, "faithful_multiple": 10}
    f = _sglang_with_server_info(tmp_path, simulator={"time_scale": 0.001,
                                                      "time_resolution": res})
    import_files([str(f)], "sglang-bench", Defaults(kv_bytes_per_token=70272))
    err = capsys.readouterr().err
    # line 2: 4 in flight -> 20 ms per request; its TTFT and total are far above 200 ms
    assert "measured against engine-advisor sim" not in err
    fast = {**res, "request_overhead_s": 0.5}
    f = _sglang_with_server_info(tmp_path, simulator={"time_scale": 0.001,
                                                      "time_resolution": fast})
    import_files([str(f)], "sglang-bench", Defaults(kv_bytes_per_token=70272))
    err = capsys.readouterr().err
    assert "sg.jsonl:1: measured against engine-advisor sim: TTFT" in err
    assert "within 10x the simulator's overhead of 500 ms per request at 1 in flight" in err


# ----------------------------------------------------------------------------- semantics
def test_vllm_arrays_give_the_pure_decode_step_and_the_architecture(tmp_path):
    """All requests sent at once: the decode step from the per-request streams, as
    ``calibrate run`` derives it; the file's model id names the architecture."""
    from engine_advisor.calibration.sweep.streams import Stream, stream_times

    raw = json.loads(VLLM.read_text())
    (row,) = import_files([str(VLLM)], "vllm-bench", Defaults(mem_fraction=0.92))
    # this file's first request ends before its last one starts decoding: no window in which
    # the whole batch decodes, so no decode step
    assert min(t + sum(g) for t, g in zip(raw["ttfts"], raw["itls"], strict=True)) < max(
        raw["ttfts"])
    assert row.decode_step_s is None and row.tpot_s is not None
    # first tokens close together: the window exists
    raw["ttfts"] = [0.2 + 0.01 * i for i in range(8)]
    p = tmp_path / "close.json"
    p.write_text(json.dumps(raw))
    (row,) = import_files([str(p)], "vllm-bench", Defaults(mem_fraction=0.92))
    streams = [Stream.of(0.0, t, g) for t, g in zip(raw["ttfts"], raw["itls"], strict=True)]
    expected = stream_times(streams, 8192)
    assert expected.decode_step_s is not None and expected.decode_steps > 100
    assert row.decode_step_s == pytest.approx(expected.decode_step_s)
    assert row.ttft_s == pytest.approx(expected.prefill_s)
    # moonshotai/Kimi-K2-Instruct: the kimi-k2 preset, its KV bytes at bf16
    assert (row.model, row.kv_bytes_per_token, row.kv_cache_dtype) == ("kimi-k2", 70272, "bf16")
    assert row.weights == "real"


def test_without_arrays_only_a_single_request_gives_a_decode_step():
    lines = [json.loads(s) for s in SGLANG.read_text().splitlines()]
    rows = import_files([str(SGLANG)], "sglang-bench", Defaults(kv_bytes_per_token=70272,
                                                                 dcp_size=8))
    # line 1: one request, no arrays: its median ITL is its decode step
    assert rows[0].decode_step_s == pytest.approx(lines[0]["median_itl_ms"] / 1e3)
    # line 2: four requests with arrays: from the streams
    assert rows[1].decode_step_s is not None
    # several waves and no arrays: no decode step, no prefill
    (summary,) = import_files([str(VLLM_SUMMARY)], "vllm-bench", D)
    assert summary.decode_step_s is None and summary.ttft_s is None


def test_a_batch_without_arrays_records_no_decode_step(tmp_path):
    obj = json.loads(VLLM.read_text())
    for key in ("ttfts", "itls", "input_lens", "output_lens", "errors", "start_times"):
        obj.pop(key, None)
    p = tmp_path / "agg.json"
    p.write_text(json.dumps(obj))
    (row,) = import_files([str(p)], "vllm-bench", D)
    assert row.batch_size == 8 and row.decode_step_s is None and row.tpot_s is not None


def test_sglang_server_info_gives_weights_and_capacity(tmp_path):
    line = json.loads(SGLANG.read_text().splitlines()[1])
    line["server_info"] = {"tp_size": 8, "dcp_size": 8, "load_format": "dummy",
                           "max_total_num_tokens": 5_000_000,
                           "served_model_name": "deepseek-ai/DeepSeek-V3"}
    p = tmp_path / "s.jsonl"
    p.write_text(json.dumps(line) + "\n")
    (row,) = import_files([str(p)], "sglang-bench", Defaults())
    assert (row.weights, row.kv_capacity_tokens, row.model) == ("dummy", 5_000_000,
                                                                "deepseek-v3")
    assert row.kv_bytes_per_token == 70272
    with pytest.raises(BenchFileError, match="--load-format real contradicts the engine"):
        import_files([str(p)], "sglang-bench", Defaults(load_format="real"))
    with pytest.raises(BenchFileError, match="--kv-bytes-per-token: 1000 disagrees with "
                                             "--preset llama-3.1-8b"):
        import_files([str(p)], "sglang-bench", Defaults(preset="llama-3.1-8b",
                                                        kv_bytes_per_token=1000))
