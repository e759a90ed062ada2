"""``fit --report``: cross-validated errors, coverage, ranges, crossovers and plots."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from calib_helpers import cli_in_process
from calib_synth import KV, rows

from engine_advisor.model.decision.crossover import crossovers
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.fit.dataset import write_csv
from engine_advisor.model.fit.rows import row_case
from engine_advisor.model.physics.features import case_features
from engine_advisor.model.predict.query import total_curves
from engine_advisor.model.workload import Config, Workload


def noisy(sd: float = 0.02, seed: int = 3, **kw):
    rng = random.Random(seed)
    return [r.model_copy(update={k: getattr(r, k) * (1 + rng.gauss(0, sd))
                                 for k in ("ttft_s", "decode_step_s", "total_s")})
            for r in rows(**kw)]


def true_crossover(batch: int, out: int) -> int:
    model = CostModel.fit(rows())
    w = Workload(context_tokens=8192, output_tokens=out, batch_size=batch, kv_bytes_per_token=KV)
    grid = np.geomspace(1024, 262144, 400)
    cfg = [Config("sglang", 8), Config("vllm", 1)]
    return crossovers(grid, total_curves(model, w, w.model_shape(), cfg, grid))[0][0]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    data = noisy(contexts=(2048, 4096, 8192, 16384), batches=(1, 4, 8), outputs=(32,))
    oom = data[0].model_copy(update={"mem_fraction": 0.95, "ttft_s": None, "tpot_s": None,
                                     "total_s": None, "oom_retries": 1, "errors": 1})
    write_csv(tmp / "data.csv", [*data, oom])
    r = cli_in_process("fit", "--kv-bytes-only", str(tmp / "data.csv"), "--out",
                       str(tmp / "m.json"),
                       "--report", str(tmp / "rep"))
    assert r.returncode == 0, r.stderr
    assert "wrote report" in r.stdout
    return tmp / "rep", json.loads((tmp / "rep" / "report.json").read_text())


def test_cross_validated_error_and_coverage_per_engine_and_dcp(report):
    _, rep = report
    cv = rep["cross_validation"]
    assert set(cv) == {"vllm dcp1", "sglang dcp8"}
    for s in cv.values():
        assert s["n_points"] == 12
        # 2 % noise on each value: held-out errors of a few per cent, not zero, not large
        assert 0.003 < s["cv_mape_total"] < 0.05 and 0.003 < s["cv_mape_step"] < 0.05
        assert 0.6 <= s["interval_coverage"] <= 1.0
    # three figures per point; a batch that queues has no prefill figure (its last first token
    # waits for running sequences: engine_advisor.model.fit.fitting.observations)
    data = noisy(contexts=(2048, 4096, 8192, 16384), batches=(1, 4, 8), outputs=(32,))
    queued = sum(case_features(row_case(r)).running[0] < r.batch_size for r in data)
    assert queued >= 1
    assert len(rep["held_out"]) == 2 * 12 * 3 - queued


def test_ranges_memory_and_crossovers(report):
    _, rep = report
    (served, rng), = rep["calibrated_ranges"]["vllm/B300/8/1"].items()   # one served model
    assert served.startswith("kv2000000@") and rng["context_tokens"] == [2048, 16384]
    assert rep["memory_fractions"] == {"vllm/B300": {"safe": [0.9], "unsafe": [0.95]},
                                       "sglang/B300": {"safe": [0.9], "unsafe": []}}
    by_batch = {x["batch_size"]: x for x in rep["crossovers"]}
    assert set(by_batch) <= {1, 4, 8} and 4 in by_batch
    x = by_batch[4]
    assert (x["from"], x["to"]) == ("vllm dcp1", "sglang dcp8")
    assert x["context_tokens"] == pytest.approx(true_crossover(4, 32), rel=0.10)


def test_plots_and_markdown_are_written(report):
    folder, rep = report
    assert rep["plots"] == ["measured_vs_predicted.png", "total_vs_context.png"]
    for name in rep["plots"]:
        data = (folder / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    md = (folder / "report.md").read_text()
    assert "| vllm dcp1 | 12 |" in md and "![total_vs_context.png](total_vs_context.png)" in md
    assert "vllm dcp1 -> sglang dcp8 near" in md


def test_report_with_too_few_points_still_writes(tmp_path):
    data = rows(contexts=(4096,), batches=(4,), outputs=(32,))
    write_csv(tmp_path / "d.csv", data)
    r = cli_in_process("fit", "--kv-bytes-only", str(tmp_path / "d.csv"), "--out",
                       str(tmp_path / "m.json"),
                       "--report", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["cross_validation"] == {} and rep["plots"] == ["total_vs_context.png"]
    assert "no cross-validation" in (tmp_path / "rep" / "report.md").read_text()
