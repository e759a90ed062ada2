"""The simulator's time resolution: measured at startup, and ``calibrate run`` warns when the
times it measures are mostly that overhead."""

from __future__ import annotations

import json

import httpx
from simproc import SimProcess

from engine_advisor.calibration.sweep.honesty import overhead_warnings, resolution_of
from engine_advisor.cli.main import main
from engine_advisor.model.fit.dataset import Measurement


def _row(**kw) -> Measurement:
    base = dict(engine="vllm", gpu="B300", num_gpus=8, mem_fraction=0.9, context_tokens=1024,
                output_tokens=64, batch_size=4, kv_bytes_per_token=70272, ttft_s=1.0,
                tpot_s=0.02, total_s=2.0)
    return Measurement(**{**base, **kw})


def test_overhead_scales_with_the_requests_in_flight():
    res = {"request_overhead_s": 0.004, "token_overhead_s": 0.0002, "faithful_multiple": 10}
    assert overhead_warnings(_row(), res) == []
    # 4 in flight: 16 ms per request, 0.8 ms per token; x10 = 160 ms, 8 ms
    slow_ttft = overhead_warnings(_row(ttft_s=0.15), res)
    assert len(slow_ttft) == 1 and slow_ttft[0].startswith("TTFT 150 ms is within 10x")
    assert overhead_warnings(_row(ttft_s=0.17), res) == []
    assert [w.split()[0] for w in overhead_warnings(_row(tpot_s=0.007), res)] == ["TPOT"]
    assert resolution_of({"simulator": {"time_resolution": res}}) == res
    assert resolution_of({"time_resolution": {"request_overhead_s": "x"}}) is None
    assert resolution_of(None) is None


def _cli(capsys, *args: str):
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.err


def test_calibrate_run_against_a_fast_simulator_warns(tmp_path, capsys):
    with SimProcess("--engine", "vllm", "--time-scale", "0.0001") as s:
        res = httpx.get(s.url + "/sim/info").json()["time_resolution"]
        r = _cli(capsys, "calibrate", "run", "--engine", "vllm", "--url", s.url,
                           "--contexts", "1024", "--batch-sizes", "2", "--output-tokens", "16",
                           "--kv-bytes-per-token", "70272", "--out", str(tmp_path / "run"),
                           "--no-progress")
    code, err = r
    assert code == 0, err
    assert res["min_simulated_s"] > 1.0          # 0.1 ms of wall time per simulated second
    assert "the simulator's overhead" in err and "raise the simulator's --time-scale" in err
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "time-resolution" for e in events)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    engines = manifest["engines"]
    assert any("sim_time_resolution" in v for v in engines.values())


def test_admit_window_batches_a_staggered_burst():
    """Two requests sent 50 ms apart to an idle engine with a 300 ms window are prefilled in
    one step: their first tokens come together, not 50 ms apart."""
    import subprocess
    import threading
    import time

    from simproc import EXE

    bad = subprocess.run([EXE, "sim", "--engine", "vllm", "--port", "1", "--admit-window-ms",
                          "-1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--admit-window-ms: -1.0 is outside" in bad.stderr
    with SimProcess("--engine", "sglang", "--time-scale", "0.001",
                    "--admit-window-ms", "300") as s:
        firsts: dict[int, float] = {}

        def send(i: int) -> None:
            with httpx.stream("POST", s.url + "/generate", timeout=30, json={
                    "input_ids": list(range(100 + i, 400 + i)), "stream": True,
                    "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        firsts[i] = time.perf_counter()
                        break

        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        t0 = time.perf_counter()
        threads[0].start()
        time.sleep(0.05)
        threads[1].start()
        for t in threads:
            t.join()
    assert firsts[0] - t0 >= 0.3                  # the window passed before the first step
    assert abs(firsts[1] - firsts[0]) < 0.04      # one prefill step for both
