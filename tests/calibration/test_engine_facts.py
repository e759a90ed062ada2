"""Engine facts parsed from the real vLLM 0.26.0 and SGLang 0.5.16 start-up logs, /metrics and
server info measured on an H200 (bench/data/h200-real/logs/), and the JIT watch."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from engine_advisor.calibration.sweep.engine_endpoints import (
    parse_metrics,
    parse_sglang_server_info,
)
from engine_advisor.calibration.sweep.engine_facts import EngineFacts
from engine_advisor.calibration.sweep.engine_jit import JitEvent, LogTail, log_time
from engine_advisor.calibration.sweep.engine_logs import parse_log
from engine_advisor.calibration.sweep.engine_sources import FactsError, gather, weights_of
from engine_advisor.calibration.sweep.jitwatch import Interval, attribute

LOGS = Path(__file__).resolve().parents[2] / "bench" / "data" / "h200-real" / "logs"


def text(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8", errors="replace")


def test_vllm_deepseek_start_up_log():
    f = parse_log("vllm", text("vllm-deepseek-v2-lite.log"))
    assert f.kv_capacity_tokens == 3_284_944
    assert f.kv_cache_gib == 95.16
    assert (f.weights_gib, f.peak_activation_gib, f.non_torch_gib, f.cuda_graph_gib) == (
        29.34, 1.09, 0.23, 1.2)
    assert (f.free_at_start_gib, f.gpu_total_gib) == (139.29, 139.8)
    assert f.chunk_tokens == 8192 and f.prefix_caching is True and f.mem_fraction == 0.9
    assert f.load_format == "dummy" and f.dummy_weights is True
    assert (f.attention_backend, f.moe_backend, f.version) == ("FLASH_ATTN_MLA", "TRITON",
                                                               "0.26.0")
    assert f.max_model_len == 135168
    assert [(e.kernel, e.log_time) for e in f.jit] == [
        ("fused_moe_kernel", "12-01 09:44:21"), ("mask_empty_context_kernel", "12-01 09:44:32")]
    assert f.sources["kv_capacity_tokens"] == "log"


def test_vllm_llama_logs_at_two_memory_fractions():
    f = parse_log("vllm", text("vllm-llama-3.1-8b.log"))
    assert (f.kv_capacity_tokens, f.kv_cache_gib, f.weights_gib) == (896_912, 109.49, 15.0)
    assert f.attention_backend == "FLASH_ATTN" and f.moe_backend is None and f.jit == []
    half = parse_log("vllm", text("vllm-llama-mem0.5.log"))
    assert (half.kv_capacity_tokens, half.mem_fraction, half.kv_cache_gib) == (440_688, 0.5, 53.8)


def test_sglang_start_up_logs():
    f = parse_log("sglang", text("sglang-deepseek-v2-lite.log"))
    assert (f.free_at_start_gib, f.weights_gib) == (139.09, 29.47)
    assert (f.kv_capacity_tokens, f.kv_cache_gib) == (3_303_934, 95.71)
    assert (f.chunk_tokens, f.max_prefill_tokens, f.max_model_len) == (8192, 16384, 135168)
    assert f.free_after_pool_gib == 11.82 and f.cuda_graph_gib == 0.17
    assert (f.load_format, f.mem_fraction, f.prefix_caching) == ("dummy", 0.9, True)
    assert f.attention_backend == "fa3"
    llama = parse_log("sglang", text("sglang-llama-3.1-8b.log"))
    assert (llama.kv_capacity_tokens, llama.kv_cache_gib) == (902_375, 110.16)   # K + V
    assert llama.cuda_graph_gib == pytest.approx(1.38 + 0.11)    # prefill and decode graphs
    half = parse_log("sglang", text("sglang-llama-mem0.5.log"))
    assert (half.kv_capacity_tokens, half.mem_fraction) == (446_265, 0.5)
    assert half.chunk_tokens is None      # that start never reached its summary line


@pytest.mark.parametrize("tag, tokens", [("vllm-deepseek-v2-lite", 3_284_944),
                                         ("vllm-llama-3.1-8b", 896_912),
                                         ("sglang-deepseek-v2-lite", 3_303_934),
                                         ("sglang-llama-3.1-8b", 902_375)])
def test_metrics_and_server_info_agree_with_the_logs(tag, tokens):
    engine = tag.split("-")[0]
    m = parse_metrics(text(f"{tag}.metrics.txt"))
    log = parse_log(engine, text(f"{tag}.log"))
    assert m.kv_capacity_tokens == tokens == log.kv_capacity_tokens
    if engine == "vllm":
        assert m.block_size == 16 and m.num_gpu_blocks * 16 == tokens
        assert m.prefix_caching is True and m.mem_fraction == 0.9
    else:
        info = parse_sglang_server_info(json.loads(text(f"{tag}.info.json")))
        assert (info.kv_capacity_tokens, info.chunk_tokens, info.load_format) == (
            tokens, 8192, "dummy")
        assert info.prefix_caching is True and info.mem_fraction == 0.9
        assert info.version == "0.5.16"


def test_cache_config_info_of_an_older_vllm_gives_blocks_times_block_size():
    f = parse_metrics('vllm:cache_config_info{block_size="16",num_gpu_blocks="1000",'
                      'enable_prefix_caching="False",gpu_memory_utilization="0.92"} 1.0\n'
                      '# HELP other\nvllm:num_requests_running{engine="0"} 3.0\n')
    assert (f.kv_capacity_tokens, f.prefix_caching, f.mem_fraction) == (16_000, False, 0.92)
    assert parse_metrics("garbage {\nno value here\n").empty


def test_gather_puts_live_sources_before_the_log():
    log = "INFO 12-01 09:00:00 [x] GPU KV cache size: 1,000 tokens\n"
    metrics = 'vllm:cache_config_info{kv_cache_size_tokens="2000",block_size="16"} 1.0\n'
    f = gather("vllm", metrics=metrics, log=log,
               command=["vllm", "serve", "m", "--load-format=dummy"])
    assert f.kv_capacity_tokens == 2000 and f.sources["kv_capacity_tokens"] == "metrics"
    assert f.load_format == "dummy" and f.sources["load_format"] == "command"
    assert gather("vllm", log=log).kv_capacity_tokens == 1000
    back = EngineFacts.from_json(f.to_json())
    assert back.kv_capacity_tokens == 2000 and back.sources == f.sources


def test_weights_from_the_flag_or_what_the_engine_states():
    dummy = parse_sglang_server_info({"load_format": "dummy"})
    checkpoint = parse_sglang_server_info({"load_format": "auto"})
    assert weights_of(dummy, None) == "dummy" and weights_of(checkpoint, None) == "real"
    assert weights_of(EngineFacts(), None) == "real"          # vLLM --url: not stated
    assert weights_of(EngineFacts(), "dummy") == "dummy"
    with pytest.raises(FactsError, match=r"--load-format real contradicts the engine, which "
                                         r"reports load_format 'dummy' \(from server_info\)"):
        weights_of(dummy, "real")


def test_log_time_takes_the_year_closest_to_the_point():
    near = dt.datetime(2026, 12, 1, 9, 44, 20, tzinfo=dt.UTC)
    assert log_time("12-01 09:44:21", near) == dt.datetime(2026, 12, 1, 9, 44, 21, tzinfo=dt.UTC)
    new_year = dt.datetime(2027, 1, 1, 0, 0, 1, tzinfo=dt.UTC)
    assert log_time("12-31 23:59:59", new_year).year == 2026
    assert log_time("2026-12-01 09:35:57", near).minute == 35
    assert log_time("13-45 99:00:00", near) is None


def test_jit_lines_are_matched_to_the_point_they_hit():
    t0 = dt.datetime(2026, 12, 1, 9, 44, 19, 200000, tzinfo=dt.UTC)
    s = dt.timedelta(seconds=1)
    intervals = [Interval("warmup", t0, t0 + 0.5 * s),
                 Interval("ctx=1024:batch=1", t0 + s, t0 + 1.4 * s),
                 Interval("ctx=1024:batch=8", t0 + 1.5 * s, t0 + 3.3 * s)]
    events = [JitEvent("fused_moe_kernel", "12-01 09:44:21"),
              JitEvent("late", "12-01 09:50:00"), JitEvent("bad", "xx")]
    # by time alone: the interval overlapping the line's second most
    assert [(h.during, h.matched_by) for h in attribute(events[:1], intervals, tz=dt.UTC)] == [
        ("ctx=1024:batch=8", "time")]
    # the line appeared in the log during batch=1 (and its second is within that one's slack)
    hits = attribute(events, intervals, fallback="ctx=1024:batch=1", tz=dt.UTC)
    assert [(h.kernel, h.during, h.matched_by) for h in hits] == [
        ("fused_moe_kernel", "ctx=1024:batch=1", "time and log position"),
        ("late", "ctx=1024:batch=1", "log position"), ("bad", "ctx=1024:batch=1", "log position")]
    # a fallback that the time rules out loses to the time
    assert attribute(events[:1], intervals, fallback="warmup", tz=dt.UTC)[0].during == \
        "ctx=1024:batch=8"
    assert attribute(events[1:2], intervals, tz=dt.UTC)[0].during is None


def test_log_tail_reads_whole_lines_only(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("old line\n")
    tail = LogTail(log, log.stat().st_size)
    assert tail.read() == ""
    with log.open("a") as f:
        f.write("new line\nhalf a li")
    assert tail.read() == "new line\n"
    with log.open("a") as f:
        f.write("ne\n")
    assert tail.read() == "half a line\n"
    assert LogTail(tmp_path / "missing.log").read() == ""


def test_every_engine_has_a_log_parser():
    from engine_advisor.calibration.sweep.engine_endpoints import SERVER_INFO_PARSERS
    from engine_advisor.calibration.sweep.engine_logs import LOG_PARSERS
    from engine_advisor.model import engines
    assert set(LOG_PARSERS) == set(engines.names())
    assert set(SERVER_INFO_PARSERS) <= set(engines.names())


# ----------------------------------------------------------------------------- hybrid models
# Lines of the 2026-12-03 H200 start-up logs (bench/data/h200-real/logs/), as the engines wrote
# them (the argument dictionaries and ServerArgs shortened around the keys that matter)
VLLM_NEMOTRON = """\
(APIServer pid=2111) INFO 12-03 13:45:37 [api_utils.py:273] non-default args: {'model_tag': \
'/tmp/res-vl/models/nemotron-3-nano-30b-a3b', 'max_model_len': 262144, 'load_format': 'dummy', \
'gpu_memory_utilization': 0.9, 'max_num_seqs': 128}
(EngineCore pid=2247) INFO 12-03 13:46:29 [interface.py:905] Setting attention block size to \
2096 tokens to ensure that attention page size is >= mamba page size.
(EngineCore pid=2247) INFO 12-03 13:46:29 [interface.py:929] Padding mamba page size by 0.58% \
to ensure that mamba page size and attention page size are exactly equal.
(EngineCore pid=2247) WARNING 12-03 13:48:08 [kv_cache_utils.py:1237] Add 1 padding layers, \
may waste at most 4.35% KV cache memory
(EngineCore pid=2247) INFO 12-03 13:48:13 [gpu_worker.py:560] Available KV cache memory: \
65.14 GiB
(EngineCore pid=2247) INFO 12-03 13:48:13 [kv_cache_utils.py:2177] GPU KV cache size: \
10,951,569 tokens
(EngineCore pid=2247) INFO 12-03 13:48:13 [kv_cache_utils.py:2178] Maximum concurrency for \
262,144 tokens per request: 41.78x
"""
SGLANG_QWEN3_NEXT = """\
[2026-12-03 13:49:57] server_args=ServerArgs(model_path='/tmp/res-sg/models/qwen3-next-80b-a3b\
-fp8', load_format='dummy', mem_fraction_static=0.9, max_running_requests=None, \
max_queued_requests=None, max_total_tokens=None, chunked_prefill_size=8192, \
max_prefill_tokens=16384, disable_radix_cache=False, max_mamba_cache_size=None)
[2026-12-03 13:50:24] Mamba Cache is allocated. max_mamba_cache_size: 330, conv_state size: \
0.55GB, ssm_state size: 23.27GB 
[2026-12-03 13:50:24] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1152938, K size: \
13.19 GB, V size: 13.19 GB
[2026-12-03 13:50:24] Memory pool end. avail mem=13.78 GB
[2026-12-03 13:52:18] max_total_num_tokens=1152938, chunked_prefill_size=8192, \
max_prefill_tokens=16384, max_running_requests=66, context_len=262144, \
available_gpu_mem=11.15 GB
"""


def test_vllm_hybrid_start_up_lines():
    f = parse_log("vllm", VLLM_NEMOTRON)
    assert (f.block_size, f.max_concurrency, f.kv_capacity_tokens) == (2096, 41.78, 10_951_569)
    assert (f.max_running, f.max_running_requested) == (128, 128)   # --max-num-seqs 128
    assert (f.state_slots, f.state_pool_gib) == (None, None)          # SGLang's facts
    assert f.sources["max_running"] == "log" and f.kv_cache_gib == 65.14
    # without --max-num-seqs vLLM does not log its default: neither limit is known
    default = parse_log("vllm", VLLM_NEMOTRON.replace(", 'max_num_seqs': 128", ""))
    assert (default.max_running, default.max_running_requested) == (None, None)
    # a backend's own block size, on a model without Mamba layers
    backend = parse_log("vllm", "INFO 12-01 09:00:00 [interface.py:636] Setting kv cache block "
                                "size to 64 for FLASHMLA backend.\n")
    assert backend.block_size == 64


def test_sglang_hybrid_start_up_lines():
    f = parse_log("sglang", SGLANG_QWEN3_NEXT)
    assert (f.state_slots, f.state_pool_gib) == (330, pytest.approx(0.55 + 23.27))
    assert (f.kv_capacity_tokens, f.kv_cache_gib) == (1_152_938, pytest.approx(26.38))
    assert f.max_running == 66                   # what the scheduler runs with
    assert f.max_running_requested is None       # max_running_requests=None: the default
    assert (f.block_size, f.max_concurrency) == (None, None)
    # a launch that asked for a limit the pools could not hold
    asked = parse_log("sglang", SGLANG_QWEN3_NEXT.replace(
        "max_running_requests=None", "max_running_requests=256"))
    assert (asked.max_running_requested, asked.max_running) == (256, 66)
    warned = parse_log("sglang", "[2026-12-03 13:50:25] max_running_requests was reduced from "
                                 "the requested 256 to 66 (per dp worker) due to the available "
                                 "KV cache capacity.\n")
    assert (warned.max_running_requested, warned.max_running) == (256, 66)
    # with speculative decoding the state pool also holds the intermediate caches
    spec = parse_log("sglang", "Mamba Cache is allocated. max_mamba_cache_size: 263, conv_state "
                               "size: 0.44GB, ssm_state size: 18.56GB intermediate_ssm_state_cache"
                               " size: 1.50GB intermediate_conv_window_cache size: 0.10GB \n")
    assert (spec.state_slots, spec.state_pool_gib) == (263, pytest.approx(20.6))


def test_the_hybrid_logs():
    """The three hybrid start-ups of 2026-12-03, whole: vLLM Nemotron-3-Nano, SGLang Qwen3-Next
    and vLLM Qwen3-Next (start-up only: its engine died at the first request)."""
    nemotron = parse_log("vllm", text("vllm-nemotron-3-nano-30b-a3b.log"))
    assert (nemotron.block_size, nemotron.max_concurrency, nemotron.max_running,
            nemotron.max_running_requested) == (2096, 41.78, 128, 128)
    assert (nemotron.kv_capacity_tokens, nemotron.max_model_len) == (10_951_569, 262_144)
    qwen_vllm = parse_log("vllm", text("vllm-qwen3-next-80b-a3b-fp8.log"))
    assert (qwen_vllm.block_size, qwen_vllm.max_concurrency, qwen_vllm.max_running,
            qwen_vllm.kv_capacity_tokens) == (544, 8.07, 128, 2_114_448)
    assert qwen_vllm.kv_cache_gib == 48.72 and qwen_vllm.weights_gib == 74.9
    qwen = parse_log("sglang", text("sglang-qwen3-next-80b-a3b-fp8.log"))
    assert (qwen.state_slots, qwen.state_pool_gib, qwen.max_running,
            qwen.max_running_requested) == (329, 23.74, 65, None)
    assert (qwen.kv_capacity_tokens, qwen.kv_cache_gib, qwen.weights_gib) == (
        1_154_717, 26.42, 74.97)
    # the models without Mamba layers: SGLang's scheduler limit, no state pool
    llama = parse_log("sglang", text("sglang-llama-3.1-8b.log"))
    assert (llama.max_running, llama.max_running_requested, llama.state_slots) == (
        3524, None, None)
    plain = parse_log("vllm", text("vllm-llama-3.1-8b.log"))
    assert (plain.max_running, plain.block_size, plain.max_concurrency) == (None, None, 6.84)


def test_hybrid_metrics_and_server_info_agree_with_the_logs():
    nemotron = parse_metrics(text("vllm-nemotron-3-nano-30b-a3b.metrics.txt"))
    assert (nemotron.block_size, nemotron.num_gpu_blocks) == (2096, 5431)
    assert nemotron.max_concurrency == pytest.approx(41.78, abs=0.005)
    assert nemotron.max_running is None          # vLLM's /metrics does not say it
    # SGLang: slots free + radix-cached + in use after the sweep = the pool
    qwen = parse_metrics(text("sglang-qwen3-next-80b-a3b-fp8.metrics.txt"))
    assert (qwen.state_slots, qwen.kv_capacity_tokens) == (329, 1_154_717)
    assert parse_metrics(text("sglang-llama-3.1-8b.metrics.txt")).state_slots is None
    info = parse_sglang_server_info(json.loads(text("sglang-qwen3-next-80b-a3b-fp8.info.json")))
    assert (info.max_running, info.max_running_requested, info.state_slots) == (65, None, 329)
    llama = parse_sglang_server_info(json.loads(text("sglang-llama-3.1-8b.info.json")))
    assert (llama.max_running, llama.max_running_requested, llama.state_slots) == (
        3524, None, None)
    asked = parse_sglang_server_info({"max_running_requests": 32, "internal_states": [
        {"max_running_requests": 32, "effective_max_running_requests_per_dp": 32}]})
    assert (asked.max_running, asked.max_running_requested) == (32, 32)


@pytest.mark.parametrize("engine, command, requested, running", [
    ("vllm", ["vllm", "serve", "m", "--max-num-seqs", "128"], 128, 128),
    ("vllm", ["vllm", "serve", "m", "--max_num_seqs=64"], 64, 64),
    ("sglang", ["python3", "-m", "sglang.launch_server", "--max-running-requests", "32"], 32,
     None),       # SGLang may lower it: the scheduler's line says what it runs with
    ("sglang", ["python3", "-m", "sglang.launch_server", "--max-num-seqs", "32"], None, None),
    ("vllm", ["vllm", "serve", "m"], None, None)])
def test_the_launch_command_gives_the_running_limit(engine, command, requested, running):
    f = gather(engine, command=command)
    assert (f.max_running_requested, f.max_running) == (requested, running)
    if requested:
        assert f.sources["max_running_requested"] == "command"


def test_hybrid_facts_round_trip_through_the_manifest():
    f = gather("sglang", log=text("sglang-qwen3-next-80b-a3b-fp8.log"),
               server_info=json.loads(text("sglang-qwen3-next-80b-a3b-fp8.info.json")))
    assert f.sources["max_running"] == "server_info" and f.sources["state_pool_gib"] == "log"
    d = f.to_json()
    assert (d["max_running"], d["state_slots"], d["state_pool_gib"]) == (65, 329, 23.74)
    assert "max_running_requested" not in d
    back = EngineFacts.from_json(json.loads(json.dumps(d)))
    assert (back.max_running, back.state_slots, back.state_pool_gib) == (65, 329, 23.74)
    assert back.sources == f.sources
    v = EngineFacts.from_json(gather("vllm", log=VLLM_NEMOTRON).to_json())
    assert (v.max_running_requested, v.block_size, v.max_concurrency) == (128, 2096, 41.78)
    assert EngineFacts.from_json({"state_slots": "330", "max_concurrency": True}).empty
