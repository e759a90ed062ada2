"""``calibrate run`` measures what the cost model predicts: the batch's prefill and its pure
decode step from the token streams, the served model's architecture, the engine's facts, the
weights; an untimed warm-up first; JIT compiles matched to the point they hit. Against the
in-process fake engine (calib_fakes) and, end to end, the simulator."""

from __future__ import annotations

import json
import statistics

import pytest
from calib_fakes import FakeEngine
from calib_helpers import cli_in_process

from engine_advisor.calibration.sweep.config import SweepConfig
from engine_advisor.calibration.sweep.driver import Sweep
from engine_advisor.calibration.sweep.pointtimes import RequestTimes
from engine_advisor.calibration.sweep.served_model import MODEL_CONFIG, resolve_row_config
from engine_advisor.calibration.sweep.stop import SweepAbort
from engine_advisor.calibration.sweep.streams import Stream, stream_times
from engine_advisor.calibration.sweep.warmup import OUTPUT_TOKENS, SHORT_PROMPT_TOKENS
from engine_advisor.model.arch.presets import preset_config
from engine_advisor.model.fit.dataset import read_csv

VLLM_METRICS = ('vllm:cache_config_info{block_size="16",enable_prefix_caching="True",'
                'gpu_memory_utilization="0.9",kv_cache_size_tokens="123456",'
                'num_gpu_blocks="7716"} 1.0\n')


def config(tmp_path, **kw) -> SweepConfig:
    base = dict(engine="vllm", contexts=[1024, 2048], kv_bytes_per_token=None,
                out=str(tmp_path / "run"), url="http://engine", batch_sizes=[1, 3],
                output_tokens=8, retries=0, progress=False, mem_fractions=[0.9],
                preset="deepseek-v2-lite", warmup=False)
    base.update(kw)
    cfg = SweepConfig(**base)
    cfg.validate()
    return cfg


def samples_of(folder) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in (folder / "samples.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.setdefault(rec["key"], []).append(rec)
    return out


def events_of(folder) -> list[dict]:
    path = folder / "events.jsonl"
    return [json.loads(s) for s in path.read_text().splitlines()] if path.exists() else []


def test_rows_hold_the_batch_prefill_and_the_pure_decode_step(tmp_path):
    fake = FakeEngine(metrics=VLLM_METRICS)
    Sweep(config(tmp_path), fake.transport()).run()
    folder = tmp_path / "run"
    rows = read_csv(folder / "dataset.csv")
    samples = samples_of(folder)
    assert len(rows) == 4
    for r in rows:
        recs = samples[r.source.removeprefix("calibrate:")]
        streams = [Stream.of(s["start_s"], s["ttft_s"], s["itl_s"]) for s in recs]
        st = stream_times(streams, r.context_tokens)
        # the row's times are the streams' quantities (samples round gaps to microseconds)
        assert r.decode_step_s == pytest.approx(st.decode_step_s, abs=2e-6)
        assert r.ttft_s == pytest.approx(st.prefill_s, abs=2e-6)
        assert r.ttft_s == pytest.approx(
            max(s["start_s"] + s["ttft_s"] for s in recs) - min(s["start_s"] for s in recs))
        # the engines' TPOT is kept beside it
        assert r.tpot_s == pytest.approx(statistics.mean(s["tpot_s"] for s in recs))
        if r.batch_size == 1:       # batch 1: the request's median inter-token gap
            assert r.decode_step_s == pytest.approx(statistics.median(recs[0]["itl_s"]),
                                                    abs=2e-6)
        # the architecture, from --preset; the KV bytes from it; the engine's facts
        assert (r.model, r.kv_bytes_per_token, r.kv_cache_dtype) == ("deepseek-v2-lite", 31104,
                                                                     "bf16")
        assert r.kv_capacity_tokens == 123456 and r.weights == "real"
    manifest = json.loads((folder / "manifest.json").read_text())
    facts = manifest["engines"]["dcp=1,mem=0.9"]["facts"]
    assert facts["kv_capacity_tokens"] == 123456 and facts["prefix_caching"] is True
    assert facts["sources"]["kv_capacity_tokens"] == "metrics"
    assert manifest["served_model"] == {"model": "deepseek-v2-lite", "source": "preset",
                                        "kv_bytes_per_token": 31104, "kv_cache_dtype": "bf16",
                                        "kv_shards": 1}
    assert manifest["parameters"]["preset"] == "deepseek-v2-lite"
    # every point's wall-clock start and end
    assert set(manifest["points"]) == {r.source.removeprefix("calibrate:") for r in rows}
    for t in manifest["points"].values():
        assert t["started"] <= t["finished"] and t["attempts"] == 1 and "." in t["started"]


def test_the_warm_up_runs_first_and_is_not_a_point(tmp_path):
    fake = FakeEngine(max_model_len=4096)
    cfg = config(tmp_path, warmup=True, contexts=[1024])
    Sweep(cfg, fake.transport()).run()
    # per batch size one batch of short prompts, then one prompt of two full chunks (capped by
    # the model length), all before the first timed request
    warm = [(len(b["prompt"]), b["max_tokens"]) for b in fake.requests[:5]]
    assert warm == [(SHORT_PROMPT_TOKENS, OUTPUT_TOKENS)] * 4 + [(4096 - OUTPUT_TOKENS,
                                                                 OUTPUT_TOKENS)]
    assert [len(b["prompt"]) for b in fake.requests[5:]] == [1024] * 4
    assert sum(len(v) for v in samples_of(tmp_path / "run").values()) == 4
    (event,) = [e for e in events_of(tmp_path / "run") if e["kind"] == "warmup"]
    assert [s["what"] for s in event["steps"]] == [
        "batch 1 x 64 tokens", "batch 3 x 64 tokens", "one prompt of 4092 tokens"]
    assert all(s["ok"] == s["requests"] for s in event["steps"])
    assert event["started"] <= event["finished"]


def test_a_second_sweep_of_the_same_server_warms_it_with_new_prompts(tmp_path):
    # one sweep per context against one server (bench/real_engines/run.py): a warm-up prompt
    # sent before would be answered from the engine's prefix cache and warm nothing
    fake = FakeEngine(max_model_len=4096)
    for ctx in (1024, 2048):
        Sweep(config(tmp_path / str(ctx), warmup=True, contexts=[ctx]), fake.transport()).run()
    prompts = [tuple(b["prompt"]) for b in fake.requests]
    warm = [p for p in prompts if len(p) in (SHORT_PROMPT_TOKENS, 4096 - OUTPUT_TOKENS)]
    assert len(warm) == 10 and len(set(warm)) == 10
    assert len(set(prompts)) == len(prompts)


def test_jit_compiles_in_the_engine_log_name_the_point_they_hit(tmp_path, capsys):
    log = tmp_path / "engine.log"
    log.write_text("INFO 12-01 09:00:00 [x] an earlier line\n")
    # the warm-up's long prompt (two 8,192-token chunks) compiles one kernel, the first point
    # another that no warm-up shape covers
    fake = FakeEngine(log=log, jit={16384: "mask_kernel", 2048: "fused_moe_kernel"})
    cfg = config(tmp_path, warmup=True, engine_log=str(log))
    Sweep(cfg, fake.transport()).run()
    jit = [e for e in events_of(tmp_path / "run") if e["kind"] == "jit"]
    assert [(e["kernel"], e["during"]) for e in jit] == [
        ("mask_kernel", "warmup"),
        ("fused_moe_kernel", "vllm:dcp=1:mem=0.9:ctx=2048:batch=1:out=8:rep=0")]
    assert all(e["matched_by"] == "time and log position" for e in jit)
    err = capsys.readouterr().err
    assert "JIT compile of fused_moe_kernel" in err and "mask_kernel" not in err


def test_the_engine_log_gives_the_memory_split(tmp_path):
    real = (tmp_path / "vllm.log")
    from test_engine_facts import LOGS
    real.write_bytes((LOGS / "vllm-deepseek-v2-lite.log").read_bytes())
    fake = FakeEngine(metrics=VLLM_METRICS)
    Sweep(config(tmp_path, engine_log=str(real), contexts=[1024], batch_sizes=[1]),
          fake.transport()).run()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    facts = manifest["engines"]["dcp=1,mem=0.9"]["facts"]
    assert (facts["weights_gib"], facts["kv_cache_gib"], facts["cuda_graph_gib"]) == (
        29.34, 95.16, 1.2)
    assert facts["kv_capacity_tokens"] == 123456      # /metrics first, the log after it
    # the log says --load-format dummy
    (row,) = read_csv(tmp_path / "run" / "dataset.csv")
    assert row.weights == "dummy" and manifest["engines"]["dcp=1,mem=0.9"]["weights"] == "dummy"
    # the JIT lines already in the log belong to no point of this sweep
    assert [e["kernel"] for e in facts["jit"]] == ["fused_moe_kernel",
                                                   "mask_empty_context_kernel"]
    assert not [e for e in events_of(tmp_path / "run") if e["kind"] == "jit"]


def test_rows_record_the_running_limit_as_launched(tmp_path):
    """vLLM's --max-num-seqs from the log's non-default arguments (the H200 Nemotron-3-Nano
    start), SGLang's --max-running-requests from its server info; the engine's own limit and a
    hybrid's state pool go to the manifest."""
    from test_engine_facts import LOGS
    log = tmp_path / "vllm.log"
    log.write_bytes((LOGS / "vllm-nemotron-3-nano-30b-a3b.log").read_bytes())
    fake = FakeEngine(metrics=VLLM_METRICS)
    Sweep(config(tmp_path, engine_log=str(log), contexts=[1024], batch_sizes=[1],
                 preset="nemotron-3-nano-30b-a3b"), fake.transport()).run()
    (row,) = read_csv(tmp_path / "run" / "dataset.csv")
    assert row.max_running == 128
    facts = json.loads((tmp_path / "run" / "manifest.json").read_text())["engines"][
        "dcp=1,mem=0.9"]["facts"]
    assert (facts["max_running"], facts["max_running_requested"], facts["max_concurrency"]) == (
        128, 128, 41.78)
    for limit in (None, 48):
        info = {"load_format": "dummy", "max_total_num_tokens": 1152938,
                "max_running_requests": limit, "internal_states": [
                    {"effective_max_running_requests_per_dp": limit or 66,
                     "max_mamba_cache_size": 330}]}
        out = tmp_path / f"sglang-{limit}"
        Sweep(config(tmp_path, engine="sglang", contexts=[512], batch_sizes=[1], out=str(out),
                     preset="qwen3-next-80b-a3b-fp8"),
              FakeEngine("sglang", server_info=info).transport()).run()
        (row,) = read_csv(out / "dataset.csv")
        assert row.max_running == limit
        facts = json.loads((out / "manifest.json").read_text())["engines"]["dcp=1,mem=0.9"][
            "facts"]
        assert (facts["max_running"], facts["state_slots"]) == (limit or 66, 330)


def test_sglang_states_its_load_format_and_capacity(tmp_path):
    info = {"load_format": "dummy", "max_total_num_tokens": 3303934, "chunked_prefill_size": 8192,
            "disable_radix_cache": True}
    fake = FakeEngine("sglang", server_info=info)
    Sweep(config(tmp_path, engine="sglang", contexts=[512], batch_sizes=[1]),
          fake.transport()).run()
    (row,) = read_csv(tmp_path / "run" / "dataset.csv")
    assert (row.weights, row.kv_capacity_tokens) == ("dummy", 3303934)
    facts = json.loads((tmp_path / "run" / "manifest.json").read_text())["engines"][
        "dcp=1,mem=0.9"]["facts"]
    assert facts["prefix_caching"] is False and facts["chunk_tokens"] == 8192
    with pytest.raises(SweepAbort, match=r"--load-format real contradicts the engine, which "
                                         r"reports load_format 'dummy'"):
        Sweep(config(tmp_path, engine="sglang", contexts=[512], batch_sizes=[1],
                     load_format="real", out=str(tmp_path / "other")), fake.transport()).run()


def test_the_engine_model_id_names_the_architecture(tmp_path):
    fake = FakeEngine(models=("meta-llama/Llama-3.1-8B-Instruct",))
    Sweep(config(tmp_path, preset=None, contexts=[512], batch_sizes=[1], num_gpus=1, gpu="H200"),
          fake.transport()).run()
    (row,) = read_csv(tmp_path / "run" / "dataset.csv")
    assert (row.model, row.kv_bytes_per_token, row.kv_shards) == ("llama-3.1-8b", 131072, 1)
    # a name that names nothing, and no KV bytes: nothing to record
    fake = FakeEngine(models=("m",))
    with pytest.raises(SweepAbort, match=r"--kv-bytes-per-token: required: the served model "
                                         r"'m' names no known architecture"):
        Sweep(config(tmp_path, preset=None, out=str(tmp_path / "x")), fake.transport()).run()


def test_an_hf_config_that_is_no_preset_is_stored_with_the_rows(tmp_path):
    hf = {**preset_config("llama-3.1-8b"), "num_hidden_layers": 16, "_name_or_path": "acme/half"}
    fake = FakeEngine()
    Sweep(config(tmp_path, preset=None, hf_config=hf, contexts=[512], batch_sizes=[1]),
          fake.transport()).run()
    (row,) = read_csv(tmp_path / "run" / "dataset.csv")
    assert row.model.startswith("hf:half@") and row.kv_bytes_per_token == 65536
    assert json.loads((tmp_path / "run" / MODEL_CONFIG).read_text()) == hf
    assert resolve_row_config(tmp_path / "run" / "dataset.csv", row.model) == hf


@pytest.mark.parametrize("args, message", [
    (["--preset", "deepseek-v2-lite", "--kv-bytes-per-token", "70272"],
     "--kv-bytes-per-token: 70272 disagrees with --preset deepseek-v2-lite, whose architecture "
     "stores 31104 B/token at bf16"),
    (["--model", "m"], "--kv-bytes-per-token: required: the served model 'm' names no known "
                       "architecture; give --preset, --hf-config or --kv-bytes-per-token"),
    (["--hf-config", "/nonexistent/config.json"], "--hf-config: cannot read"),
    (["--preset", "nope"], "--preset: unknown preset 'nope'"),
    (["--preset", "deepseek-v2-lite", "--load-format", "fake"], "argument --load-format"),
])
def test_bad_served_model_flags_exit_2_naming_the_flag(tmp_path, args, message):
    r = cli_in_process("calibrate", "run", "--engine", "vllm", "--url", "http://127.0.0.1:9",
                       "--contexts", "1024", "--out", str(tmp_path / "x"), *args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not (tmp_path / "x").exists()


def test_engine_log_is_for_url_mode(tmp_path):
    r = cli_in_process("calibrate", "run", "--engine", "vllm", "--launch", "sleep {port}",
                       "--contexts", "1024", "--preset", "deepseek-v2-lite", "--engine-log",
                       "x.log", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "--engine-log: only with --url" in r.stderr


def test_request_times_read_samples_and_records_alike():
    rec = {"start_s": 0.1, "ttft_s": 0.5, "e2e_s": 1.0, "itl_s": [0.1, 0.2], "tpot_s": 0.25}
    a = RequestTimes.of(rec)
    assert (a.start_s, a.itl_s, a.tpot_s) == (0.1, (0.1, 0.2), 0.25)
