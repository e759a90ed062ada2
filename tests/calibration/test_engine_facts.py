"""Engine facts parsed from the real vLLM 0.26.0 and SGLang 0.5.16 start-up logs, /metrics and
server info measured on an H200 (bench/data/h200-real/logs/), and the JIT watch."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from calibration.sweep.engine_facts import (
    EngineFacts,
    FactsError,
    JitEvent,
    LogTail,
    gather,
    log_time,
    parse_log,
    parse_metrics,
    parse_sglang_server_info,
    weights_of,
)
from calibration.sweep.jitwatch import Interval, attribute

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
    from calibration.sweep.engine_facts import LOG_PARSERS, SERVER_INFO_PARSERS
    from model import engines
    assert set(LOG_PARSERS) == set(engines.names())
    assert set(SERVER_INFO_PARSERS) <= set(engines.names())
