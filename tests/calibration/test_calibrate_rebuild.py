"""``calibrate rebuild``: old run folders gain the current semantics from their samples; the
shipped real-engine folders are exactly what rebuilding them gives. End to end against the
simulator (vLLM and SGLang personalities), and a launched simulator's facts."""

from __future__ import annotations

import csv
import io
import json
import shlex
import shutil
from pathlib import Path

import httpx
import pytest
from calib_helpers import BIN, REPO, cli_in_process

from engine_advisor.calibration.sweep.rebuild import RebuildError, RebuildInputs, plan
from engine_advisor.model.fit.dataset import COLUMNS, read_csv

OLD_COLUMNS = COLUMNS[:COLUMNS.index("decode_step_s")]   # before decode_step_s & co. existed
REAL = REPO / "bench" / "data" / "h200-real"
# time scale 2: a batch's decode window (every request decoding, none finished) four times as long
# as at 0.5, where one of three CI runs beside a CPU hog saw a batch of 4 with under 3 gaps in its
# window (the client's stamps late and uneven): no decode step
SIM_ARGS = ["--model-name", "deepseek-ai/DeepSeek-V2-Lite", "--kv-bytes-per-token", "31104",
            "--gpu", "H200", "--num-gpus", "1", "--time-scale", "2", "--max-model-len",
            "32768"]


def _script():
    """bench/real_engines/rebuild_real.py, imported by path."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "rebuild_real", REPO / "bench" / "real_engines" / "rebuild_real.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cmd(engine: str, url: str, out: Path) -> list[str]:
    # 64 output tokens: a batch's decode-step window (every request decoding, none finished)
    # stays open on a loaded machine, where the client stamps the streams late and unevenly
    return ["calibrate", "run", "--engine", engine, "--url", url, "--contexts", "2048,8192",
            "--batch-sizes", "1,4", "--output-tokens", "64", "--gpu", "H200", "--num-gpus", "1",
            "--out", str(out), "--no-progress"]


def make_old(folder: Path, oom_row: bool = True) -> None:
    """Rewrite a run folder's dataset as an older `calibrate run` wrote it: no decode step, no
    facts, its TTFT the old way; and one out-of-memory row without samples."""
    rows = list(csv.DictReader(io.StringIO((folder / "dataset.csv").read_text())))
    out = io.StringIO()
    w = csv.DictWriter(out, OLD_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({**r, "ttft_s": "9.0", "model": "", "kv_shards": "1"})
    if oom_row:
        w.writerow({**rows[0], "context_tokens": "999999", "ttft_s": "", "tpot_s": "",
                    "total_s": "", "oom_retries": "2", "errors": "2",
                    "source": rows[0]["source"].replace("ctx=2048", "ctx=999999")})
    (folder / "dataset.csv").write_text(out.getvalue())
    m = json.loads((folder / "manifest.json").read_text())
    for rec in m["engines"].values():
        rec.pop("facts", None)
        rec.pop("weights", None)
    m.pop("served_model", None)
    m.pop("points", None)
    (folder / "manifest.json").write_text(json.dumps(m))


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_run_then_rebuild_an_old_copy_of_it(tmp_path, sims, engine):
    url = sims.start(engine, *SIM_ARGS)
    capacity = httpx.get(url + "/sim/info", timeout=10).json()["kv_capacity_tokens"]
    if engine == "vllm":                   # its /metrics: num_gpu_blocks x block_size
        capacity = capacity // 16 * 16
    out = tmp_path / "run"
    r = cli_in_process(*run_cmd(engine, url, out))
    assert r.returncode == 0, r.stderr
    assert "step ms" in r.stdout
    fresh = read_csv(out / "dataset.csv")
    assert len(fresh) == 4
    for row in fresh:       # resolved from the engine's model id; KV bytes from the preset
        assert (row.model, row.kv_bytes_per_token, row.weights) == ("deepseek-v2-lite", 31104,
                                                                    "real")
        assert row.decode_step_s is not None and row.kv_capacity_tokens == capacity
        assert row.ttft_s < row.total_s
    assert any(json.loads(s)["kind"] == "warmup"
               for s in (out / "events.jsonl").read_text().splitlines())

    old = tmp_path / "old"
    shutil.copytree(out, old)
    make_old(old)
    before = (old / "samples.jsonl").read_bytes()
    # vLLM states its capacity in /metrics only; SGLang's server info is in the manifest
    facts = []
    if engine == "vllm":
        (tmp_path / "metrics.txt").write_text(httpx.get(url + "/metrics", timeout=10).text)
        facts = ["--metrics", str(tmp_path / "metrics.txt")]
    r = cli_in_process("calibrate", "rebuild", str(old), "--load-format", "dummy", *facts)
    assert r.returncode == 0, r.stderr
    assert "5 rows (4 from samples, 4 with a decode step, 1 kept as they were)" in r.stdout
    assert (old / "dataset.csv").read_text().splitlines()[0] == ",".join(COLUMNS)
    rebuilt = read_csv(old / "dataset.csv")
    for a, b in zip(fresh, rebuilt[:4], strict=True):
        assert b.decode_step_s == pytest.approx(a.decode_step_s, abs=2e-6)
        assert b.ttft_s == pytest.approx(a.ttft_s, abs=2e-6)        # re-derived, not 9.0
        assert (b.total_s, b.tpot_s) == (a.total_s, pytest.approx(a.tpot_s, abs=2e-6))
        assert (b.model, b.kv_capacity_tokens, b.weights) == ("deepseek-v2-lite", capacity,
                                                              "dummy")
    oom = rebuilt[4]
    assert oom.total_s is None and oom.oom_retries == 2 and oom.unsafe
    assert oom.weights == "dummy" and oom.model == "deepseek-v2-lite"
    assert (old / "samples.jsonl").read_bytes() == before
    m = json.loads((old / "manifest.json").read_text())
    assert m["rebuilt"][-1]["from_samples"] == 4 and m["parameters"]["load_format"] == "dummy"
    # the folder resumes under the same command (with the flag rebuild was given)
    r = cli_in_process(*run_cmd(engine, url, old), "--load-format", "dummy")
    assert r.returncode == 0, r.stderr
    assert "already recorded" in r.stderr and len(read_csv(old / "dataset.csv")) == 5


def test_rebuild_errors_name_the_folder_and_problem(tmp_path):
    r = cli_in_process("calibrate", "rebuild", str(tmp_path))
    assert r.returncode == 2 and "no manifest.json: not a run folder" in r.stderr
    folder = tmp_path / "real"
    shutil.copytree(REAL / "runs" / "vllm-deepseek-v2-lite" / "ctx1024", folder)
    r = cli_in_process("calibrate", "rebuild", str(folder), "--preset", "llama-3.1-8b")
    assert r.returncode == 2
    assert "--kv-bytes-per-token: 31104 disagrees with --preset llama-3.1-8b" in r.stderr
    r = cli_in_process("calibrate", "rebuild", str(folder), "--server-info", "/etc/hostname")
    assert r.returncode == 2 and "--server-info" in r.stderr
    r = cli_in_process("calibrate", "rebuild", str(folder), "--load-format", "real",
                       "--engine-log", str(REAL / "logs" / "vllm-deepseek-v2-lite.log"))
    assert r.returncode == 2
    assert "--load-format real contradicts the engine, which reports load_format 'dummy'" \
        in r.stderr
    # nothing was written by the refused rebuilds
    assert (folder / "dataset.csv").read_bytes() == (
        REAL / "runs" / "vllm-deepseek-v2-lite" / "ctx1024" / "dataset.csv").read_bytes()


@pytest.mark.parametrize("tag", ["vllm-deepseek-v2-lite", "sglang-deepseek-v2-lite",
                                 "vllm-llama-3.1-8b", "sglang-llama-3.1-8b"])
def test_the_shipped_real_folders_are_what_rebuilding_them_gives(tmp_path, tag):
    """bench/real_engines/rebuild_real.py's inputs, again: the same rows, bit for bit."""
    rebuild_real = _script()

    for src in sorted((REAL / "runs" / tag).iterdir()):
        folder = tmp_path / src.name
        shutil.copytree(src, folder)
        p = plan(folder, rebuild_real.inputs(tag))
        assert [r.model_dump() for r in p.rows] == [r.model_dump() for r in
                                                    read_csv(src / "dataset.csv")]
        assert all(r.decode_step_s and r.weights == "dummy" for r in p.rows)


def test_the_combined_real_dataset():
    rebuild_real = _script()

    path = REPO / "model" / "data" / "h200_real.csv"
    text = path.read_text()
    assert "python bench/real_engines/rebuild_real.py" in text and "vLLM 0.26.0" in text
    rows = read_csv(path)
    caps = {("vllm", "deepseek-v2-lite"): 3_284_944, ("sglang", "deepseek-v2-lite"): 3_303_934,
            ("vllm", "llama-3.1-8b"): 896_912, ("sglang", "llama-3.1-8b"): 902_375,
            ("vllm", "qwen3-32b"): 257_856, ("sglang", "qwen3-32b"): 262_675}
    assert {(r.engine, r.model) for r in rows} == set(caps)
    for r in rows:
        assert r.kv_capacity_tokens == caps[(r.engine, r.model)] and r.weights == "dummy"
        assert r.decode_step_s is not None and r.max_running is None, r
        jit_hit = (r.engine, r.model, r.context_tokens, r.batch_size) == (
            "vllm", "deepseek-v2-lite", 1024, 8)
        assert (r.ttft_s is None and r.total_s is None) == jit_hit, r
        assert (r.gpu, r.num_gpus, r.engine_version) == (
            "H200", 1, {"vllm": "0.26.0", "sglang": "0.5.16"}[r.engine])
    per_folder = sum(len(read_csv(f / "dataset.csv"))
                     for tag in rebuild_real.TAGS for f in (REAL / "runs" / tag).iterdir())
    assert len(rows) == per_folder == 90


@pytest.mark.parametrize("tag, max_running, facts", [
    ("vllm-nemotron-3-nano-30b-a3b", 128,
     {"max_running": 128, "max_running_requested": 128, "block_size": 2096,
      "kv_capacity_tokens": 10_951_569})])
def test_the_hybrid_folders_rebuild_with_their_running_limit(tmp_path, tag, max_running, facts):
    """The hybrids' folders (measured by the current sweep, before ``max_running``): the same
    rows again, with the limit as launched; the manifest gains the engines' hybrid facts."""
    rebuild_real = _script()
    assert tag in rebuild_real.UNFITTED_TAGS and tag in rebuild_real.REBUILT_UNFITTED
    for src in sorted((REAL / "runs" / tag).iterdir()):
        folder = tmp_path / src.name
        shutil.copytree(src, folder)
        p = plan(folder, rebuild_real.inputs(tag))
        recorded = read_csv(src / "dataset.csv")
        times = ("ttft_s", "tpot_s", "decode_step_s")      # re-derived from rounded samples
        for a, b in zip(recorded, p.rows, strict=True):
            assert b.model_dump(exclude=set(times)) == {
                **a.model_dump(exclude=set(times)), "max_running": max_running}
            for t in times:
                assert getattr(b, t) == pytest.approx(getattr(a, t), abs=2e-6)
        (got, weights), = p.facts.values()
        assert weights == "dummy"
        assert {k: getattr(got, k) for k in facts} == facts
        stored = p.manifest["engines"]["dcp=1,mem=0.9"]["facts"]
        assert {k: stored[k] for k in facts} == facts
        assert ("max_running_requested" in stored) == (max_running is not None)


def test_the_unfitted_real_dataset():
    """The runs shipped for the left-out check: Qwen3-30B-A3B and Mixtral-8x7B on both engines,
    the two stalled prefills' times left out; the hybrids, Nemotron-3-Nano on both engines
    and Qwen3-Next on both (vLLM's with its running limit as launched)."""
    rebuild_real = _script()
    rows = read_csv(REPO / "model" / "data" / "h200_real_unfitted.csv")
    caps = {("vllm", "qwen3-30b-a3b"): 714_128, ("sglang", "qwen3-30b-a3b"): 745_609,
            ("vllm", "mixtral-8x7b"): 296_352, ("sglang", "mixtral-8x7b"): 312_663,
            ("vllm", "nemotron-3-nano-30b-a3b"): 10_951_569,
            ("sglang", "nemotron-3-nano-30b-a3b"): 6_098_975,
            ("sglang", "qwen3-next-80b-a3b-fp8"): 1_154_717,
            ("vllm", "qwen3-next-80b-a3b-fp8"): 2_114_448}
    assert {(r.engine, r.model) for r in rows} == set(caps)
    stalls = {("vllm", "qwen3-30b-a3b", 1024, 64), ("vllm", "mixtral-8x7b", 32640, 2)}
    # points without a pure decode step: batches above the running limit (vLLM's 128, SGLang's
    # 65 for Qwen3-Next and 137 for Nemotron) or the KV pool (80 x 32K of Qwen3-Next) ran in
    # waves, and vLLM streamed Nemotron's 260,000-token point's outputs in three chunks
    nemotron, qwen = "nemotron-3-nano-30b-a3b", "qwen3-next-80b-a3b-fp8"
    no_step = {("vllm", nemotron, 1024, 192), ("vllm", nemotron, 260000, 1),
               ("vllm", qwen, 1024, 192), ("vllm", qwen, 32768, 80),
               ("sglang", nemotron, 1024, 192), ("sglang", qwen, 1024, 192),
               ("sglang", qwen, 32768, 80)}
    for r in rows:
        hybrid = r.model in (nemotron, qwen)
        assert r.kv_capacity_tokens == caps[(r.engine, r.model)]
        assert (r.decode_step_s is None) == (
            (r.engine, r.model, r.context_tokens, r.batch_size) in no_step), r
        stalled = (r.engine, r.model, r.context_tokens, r.batch_size) in stalls
        assert (r.ttft_s is None and r.total_s is None) == stalled, r
        # the running-request limit as launched: vLLM's hybrid --max-num-seqs, else the default
        assert r.max_running == (128 if r.engine == "vllm" and hybrid else None), r
        # SGLang's 1,024 x 192 of Nemotron: one request of each attempt lost its connection
        assert r.errors == int((r.engine, r.model) == ("sglang", nemotron) and (
            r.context_tokens, r.batch_size) == (1024, 192)), r
    per_folder = sum(len(read_csv(f / "dataset.csv")) for tag in rebuild_real.UNFITTED_TAGS
                     for f in (REAL / "runs" / tag).iterdir())
    assert len(rows) == per_folder == 94


def test_rebuild_reads_a_launched_engines_own_log(tmp_path):
    """A launch folder's logs/engine-*.log gives the facts without flags."""
    sim = (f"{shlex.quote(str(BIN))} sim --engine vllm --port {{port}} --mem-fraction "
           "{mem_fraction} --num-gpus {num_gpus} --model-name {model} --time-scale 0.1 "
           "--max-model-len 32768 --gpu H200 --kv-bytes-per-token 131072")
    out = tmp_path / "run"
    r = cli_in_process("calibrate", "run", "--engine", "vllm", "--launch", sim, "--model",
                       "llama-3.1-8b", "--num-gpus", "1", "--gpu", "H200", "--contexts", "1024",
                       "--batch-sizes", "1", "--output-tokens", "8", "--no-warmup",
                       "--stop-grace", "5", "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "manifest.json").read_text())
    facts = m["engines"]["dcp=1,mem=0.9"]["facts"]
    assert facts["sources"]["kv_cache_gib"] == "log"       # only the start-up log says it
    (row,) = read_csv(out / "dataset.csv")
    assert row.model == "llama-3.1-8b" and row.kv_capacity_tokens == facts["kv_capacity_tokens"]
    make_old(out, oom_row=False)
    p = plan(out, RebuildInputs())
    rebuilt = p.facts["dcp=1,mem=0.9"][0]
    log = (out / "logs" / "engine-dcp1-mem0.9.log").read_text()
    assert f"GPU KV cache size: {rebuilt.kv_capacity_tokens:,} tokens" in log
    assert rebuilt.sources["kv_capacity_tokens"] == "log"
    assert p.rows[0].kv_capacity_tokens == rebuilt.kv_capacity_tokens
    assert rebuilt.kv_cache_gib == facts["kv_cache_gib"]
    with pytest.raises(RebuildError, match="no manifest.json"):
        plan(tmp_path, RebuildInputs())
