"""The sweep runner against an in-process fake engine (httpx.MockTransport) and, for the CLI
paths, against closed ports."""

from __future__ import annotations

import json

import pytest
from calib_fakes import FakeEngine
from calib_helpers import cli_in_process, free_port

from engine_advisor.calibration.sweep.config import SweepConfig
from engine_advisor.calibration.sweep.driver import Sweep
from engine_advisor.calibration.sweep.outcome import summary_table
from engine_advisor.calibration.sweep.stop import SweepAbort
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.dataset import read_csv
from engine_advisor.model.physics.memory import choose_fraction


def config(tmp_path, **kw) -> SweepConfig:
    base = dict(engine="vllm", contexts=[1024, 2048], kv_bytes_per_token=70272,
                out=str(tmp_path / "run"), url="http://engine", batch_sizes=[1, 3],
                output_tokens=8, retries=1, progress=False, mem_fractions=[0.92], warmup=False)
    base.update(kw)
    cfg = SweepConfig(**base)
    cfg.validate()
    return cfg


def test_sweep_records_every_point_with_exact_lengths(tmp_path):
    fake = FakeEngine()
    outcomes = Sweep(config(tmp_path), fake.transport()).run()
    assert [o.status for o in outcomes] == ["ok"] * 4
    rows = read_csv(tmp_path / "run" / "dataset.csv")
    assert [(r.context_tokens, r.batch_size) for r in rows] == [(1024, 1), (1024, 3), (2048, 1),
                                                                (2048, 3)]
    for r in rows:
        assert r.engine_version == "0.0-fake" and r.mem_fraction == 0.92
        assert 0 < r.ttft_s < r.total_s and r.tpot_s > 0 and r.errors == 0
    # every request: token-id prompt of exactly the context, exact output forced, streamed
    assert len(fake.requests) == 8
    for body in fake.requests:
        assert body["max_tokens"] == body["min_tokens"] == 8 and body["ignore_eos"] is True
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert all(isinstance(t, int) for t in body["prompt"])
    assert sorted(len(b["prompt"]) for b in fake.requests) == [1024] * 4 + [2048] * 4
    assert len({tuple(b["prompt"][:16]) for b in fake.requests}) == 8, "prompts must differ"
    samples = [json.loads(s) for s in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8
    for s in samples:
        assert s["ok"] and s["output_tokens"] == 8 and len(s["itl_s"]) == 7
        assert s["tpot_s"] == pytest.approx((s["e2e_s"] - s["ttft_s"]) / 7)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["engines"]["dcp=1,mem=0.92"]["version"] == "0.0-fake"
    assert manifest["runs"][-1]["status"] == "finished"
    table = summary_table(outcomes)
    assert "context" in table and table.count(" ok") == 4


def test_rerun_skips_finished_points(tmp_path):
    fake = FakeEngine()
    Sweep(config(tmp_path), fake.transport()).run()
    n = len(fake.requests)
    assert Sweep(config(tmp_path), fake.transport()).run() == []
    assert len(fake.requests) == n
    assert len(read_csv(tmp_path / "run" / "dataset.csv")) == 4


def test_sglang_server_info_is_recorded(tmp_path):
    fake = FakeEngine("sglang", version="0.5.3")
    Sweep(config(tmp_path, engine="sglang", contexts=[512], batch_sizes=[1]),
          fake.transport()).run()
    info = json.loads((tmp_path / "run" / "manifest.json").read_text())["engines"]
    assert info["dcp=1,mem=0.92"]["server_info"]["mem_fraction_static"] == 0.9
    assert read_csv(tmp_path / "run" / "dataset.csv")[0].engine_version == "0.5.3"


def test_oom_points_are_recorded_as_unsafe(tmp_path):
    fake = FakeEngine(fail={2048: "CUDA out of memory. Tried to allocate 2.00 GiB"})
    outcomes = Sweep(config(tmp_path, retries=2), fake.transport()).run()
    assert [o.status for o in outcomes] == ["ok", "ok", "oom", "oom"]
    rows = read_csv(tmp_path / "run" / "dataset.csv")
    oom = [r for r in rows if r.context_tokens == 2048]
    assert all(r.total_s is None and r.oom_retries == 3 and r.unsafe for r in oom)
    assert [r.errors for r in oom] == [3, 9]      # every attempt's failed requests
    events = (tmp_path / "run" / "events.jsonl").read_text()
    assert "CUDA out of memory" in events
    # the fitted model learns that 0.92 is unsafe for vLLM on B300
    model = CostModel.fit(rows)
    assert model.memory["vllm/B300"]["unsafe"] == [0.92]
    assert choose_fraction("vllm", "B300", **model.safe_fractions("vllm", "B300")).fraction < 0.92


def test_engine_errors_are_retried_then_left_for_the_next_run(tmp_path):
    fake = FakeEngine(fail={1024: "Internal server error while processing the request"})
    outcomes = Sweep(config(tmp_path, batch_sizes=[1]), fake.transport()).run()
    assert [o.status for o in outcomes] == ["failed", "ok"]
    assert "HTTP 500: Internal server error" in outcomes[0].message
    assert [r.context_tokens for r in read_csv(tmp_path / "run" / "dataset.csv")] == [2048]
    events = [json.loads(s) for s in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["point-error", "point-error"]   # first try + 1 retry
    # the engine recovers: the next run does only the missing point
    fake.fail.clear()
    n = len(fake.requests)
    again = Sweep(config(tmp_path, batch_sizes=[1]), fake.transport()).run()
    assert [(o.key.context_tokens, o.status) for o in again] == [(1024, "ok")]
    assert len(fake.requests) == n + 1


def test_a_transient_error_is_retried_and_counted(tmp_path):
    fake = FakeEngine(flaky=1)
    outcomes = Sweep(config(tmp_path, contexts=[1024], batch_sizes=[3]), fake.transport()).run()
    assert [o.status for o in outcomes] == ["partial"]
    (row,) = read_csv(tmp_path / "run" / "dataset.csv")
    assert row.errors == 1 and row.total_s is not None and not row.unsafe
    samples = [json.loads(s) for s in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["attempt"] for s in samples) == [0, 0, 0, 1, 1, 1]
    assert [s["error"] for s in samples if not s["ok"]] == [
        "HTTP 503: The engine is temporarily unavailable"]


def test_a_hanging_engine_times_out_and_the_sweep_is_abandoned(tmp_path):
    fake = FakeEngine(fail={1024: "hang", 2048: "hang"})
    sweep = Sweep(config(tmp_path, batch_sizes=[1], retries=0, request_timeout=0.3,
                         max_failed_points=2), fake.transport())
    with pytest.raises(SweepAbort, match=r"2 points in a row failed \(last: timeout: no "
                                         r"complete response from http://engine/v1/completions "
                                         r"within 0.3 s"):
        sweep.run()
    assert [o.status for o in sweep.outcomes] == ["failed", "failed"]
    assert read_csv(tmp_path / "run" / "dataset.csv") == []
    kinds = [json.loads(s)["kind"] for s in
             (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert kinds[-1] == "abandon"
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["runs"][-1]["status"].startswith("aborted: ")


def test_unreachable_url_is_a_clear_error_and_recorded(tmp_path):
    port = free_port()
    out = tmp_path / "run"
    r = cli_in_process("calibrate", "run", "--engine", "vllm", "--url", f"http://127.0.0.1:{port}",
                       "--contexts", "1024", "--kv-bytes-per-token", "70272", "--out", str(out),
                       "--no-progress")
    assert r.returncode == 2
    assert r.stderr.startswith(f"engine-advisor: error: cannot connect to http://127.0.0.1:{port}"
                               "/health")
    assert "Traceback" not in r.stderr
    (event,) = [json.loads(s) for s in (out / "events.jsonl").read_text().splitlines()]
    assert event["kind"] == "unreachable" and str(port) in event["message"]


def test_other_parameters_into_the_same_folder_are_refused(tmp_path):
    fake = FakeEngine()
    Sweep(config(tmp_path), fake.transport()).run()
    r = cli_in_process("calibrate", "run", "--engine", "vllm", "--url", "http://127.0.0.1:9",
                       "--contexts", "1024,4096", "--batch-sizes", "1,3", "--output-tokens", "8",
                       "--mem-fraction", "0.92", "--kv-bytes-per-token", "70272",
                       "--out", str(tmp_path / "run"))
    assert r.returncode == 2
    assert "holds a different sweep (contexts: [1024, 2048] there, [1024, 4096] now)" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--dcp-sizes", "1,2"], "--url reaches one running engine"),
    (["--dcp-size", "3"], "--dcp-size: [3] do not divide --num-gpus 8"),
    (["--gpu", "A999"], "--gpu: unknown GPU 'A999'"),
    (["--contexts", "0"], "argument --contexts: expected positive integers"),
    (["--mem-fraction", "1.5"], "argument --mem-fraction/--mem-fractions: expected fractions"),
])
def test_bad_arguments_exit_2_naming_the_flag(tmp_path, args, message, capsys):
    base = ["calibrate", "run", "--engine", "vllm", "--url", "http://127.0.0.1:9", "--contexts",
            "1024", "--kv-bytes-per-token", "70272", "--out", str(tmp_path / "x")]
    if "--contexts" in args:
        base = base[:6] + base[8:]
    r = cli_in_process(*base, *args)
    assert r.returncode == 2
    assert message in r.stderr


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_text_prompts_are_checked_against_the_engines_tokenizer(tmp_path, sims, engine):
    url = sims.start(engine, "--time-scale", "0.01", "--max-model-len", "65536")
    r = cli_in_process("calibrate", "run", "--engine", engine, "--url", url, "--prompt", "text",
                       "--contexts", "100,1500", "--output-tokens", "8", "--kv-bytes-per-token",
                       "70272", "--out", str(tmp_path / "run"), "--no-progress")
    assert r.returncode == 0, r.stderr
    samples = [json.loads(s) for s in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    # the engine's own usage counts agree with the requested lengths
    assert sorted(s["prompt_tokens"] for s in samples) == [100, 1500]
    assert all(s["output_tokens"] == 8 and s["ok"] for s in samples)
