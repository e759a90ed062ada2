"""Hybrid models (linear-attention state beside the KV cache) in a real simulator process: its
start-up lines state the recommender's pool
(``engine_advisor.model.physics.capacity.instance_pool``) in the engines' own formats, it admits
requests by that pool, and the memory knobs a recommendation proposes (``instance_fit(...,
advise=True)``) let more sequences run at once.

Qwen3-Next-80B-A3B (12 attention + 36 GDN layers) and Nemotron-3-Nano-30B-A3B (Mamba2) on one
H200 at memory fraction 0.9, as in the real logs of bench/data/h200-real/logs/."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest
from proc import Proc, start_all

from engine_advisor.calibration.sweep.engine_endpoints import parse_metrics
from engine_advisor.calibration.sweep.engine_logs import parse_log
from engine_advisor.model.engines import get as engine_record
from engine_advisor.model.engines.base import MemoryKnobs
from engine_advisor.model.hardware.gpus import builtin_gpu
from engine_advisor.model.physics.capacity import Pool, instance_fit, instance_pool
from engine_advisor.model.physics.shape import shape_of

GIB = 2 ** 30
GPU = "H200"
FRACTION = 0.9
PRESETS = {"qwen3-next-80b-a3b-fp8": 24_576, "nemotron-3-nano-30b-a3b": 6_144}
QWEN = "qwen3-next-80b-a3b-fp8"
LOGS = Path(__file__).resolve().parents[2] / "bench" / "data" / "h200-real" / "logs"
RUNNING = {"vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
           "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs")}

# the hybrid lines as a reader of real logs finds them (the rest: calibration's parse_log)
BLOCK = re.compile(r"Setting attention block size to (\d+) tokens to ensure that attention "
                   r"page size is >= mamba page size\.")
PADDING = re.compile(r"Add (\d+) padding layers, may waste at most ([\d.]+)% KV cache memory")
CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
MAMBA = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+), conv_state size: "
                   r"([\d.]+)GB, ssm_state size: ([\d.]+)GB ")
KV = re.compile(r"KV Cache is allocated\. dtype: torch\.bfloat16, #tokens: (\d+), "
                r"K size: ([\d.]+) GB, V size: ([\d.]+) GB")
SUMMARY = re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=8192, "
                     r"max_prefill_tokens=16384, max_running_requests=(\d+), context_len=(\d+), "
                     r"available_gpu_mem=[\d.]+ GB")
REDUCED = re.compile(r"max_running_requests was reduced from the requested (\d+) to (\d+) "
                     r"\(per dp worker\) due to the available KV cache capacity\.")


def pool_of(engine: str, preset: str, **knobs) -> Pool:
    """The model's pool of ``preset`` on one H200 at 0.9, launched with ``knobs``."""
    shape = shape_of(preset, "bf16", PRESETS[preset])
    return instance_pool(engine, FRACTION, builtin_gpu(GPU), shape, 1, 1, MemoryKnobs(**knobs))


def sim(engine: str, preset: str, *flags: str, scale: str = "0.05") -> Proc:
    return Proc("sim", "--engine", engine, "--model-name", preset, "--kv-bytes-per-token",
                str(PRESETS[preset]), "--gpu", GPU, "--num-gpus", "1", "--mem-fraction",
                str(FRACTION), "--time-scale", scale, *flags)


def one(pattern: re.Pattern[str], text: str) -> tuple[str, ...]:
    found = pattern.findall(text)
    assert found, pattern.pattern
    return found[-1] if isinstance(found[-1], tuple) else (found[-1],)


def real(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8", errors="replace")


# ----------------------------------------------------------------------- (a) start-up lines
def test_the_parsers_read_the_real_engines_hybrid_lines():
    """The patterns below read the real vLLM 0.26.0 and SGLang 0.5.16 logs on an H200: what
    the simulator prints must be readable the same way."""
    vq = real("vllm-qwen3-next-80b-a3b-fp8.log")
    assert one(BLOCK, vq) == ("544",)
    assert one(CONCURRENCY, vq) == ("262,144", "8.07")
    assert parse_log("vllm", vq).kv_capacity_tokens == 2_114_448
    vn = real("vllm-nemotron-3-nano-30b-a3b.log")
    assert one(BLOCK, vn) == ("2096",) and one(PADDING, vn) == ("1", "4.35")
    sq = real("sglang-qwen3-next-80b-a3b-fp8.log")
    assert one(MAMBA, sq) == ("329", "0.54", "23.20")
    assert one(KV, sq) == ("1154717", "13.21", "13.21")
    assert one(SUMMARY, sq) == ("1154717", "65", "262144")
    facts = parse_log("sglang", sq)
    assert (facts.kv_capacity_tokens, facts.kv_cache_gib) == (1_154_717, 26.42)


@pytest.fixture(scope="module")
def started():
    """Both presets on both engines with the engines' defaults, started together."""
    procs = {(e, p): sim(e, p) for e in ("vllm", "sglang") for p in PRESETS}
    start_all(*procs.values(), timeout=120.0)
    yield procs
    for p in procs.values():
        p.stop()


@pytest.mark.parametrize("preset", list(PRESETS))
def test_vllm_start_up_lines_state_the_pool(started, preset):
    s = started["vllm", preset]
    pool = pool_of("vllm", preset)
    log = s.log
    blocks = pool.units + 1                      # the pool's blocks, its null block included
    assert int(one(BLOCK, log)[0]) == pool.unit_tokens == pool.layout.block_tokens
    facts = parse_log("vllm", log)
    assert facts.kv_capacity_tokens == pool.capacity_tokens
    assert facts.kv_cache_gib == round(blocks * pool.layout.unit_bytes / GIB, 2)
    length, x = one(CONCURRENCY, log)
    assert int(length.replace(",", "")) == 262_144
    assert float(x) == round(blocks / pool.units_for(262_144), 2)
    assert float(x) == pytest.approx(pool.capacity_tokens / 262_144, abs=0.006)
    for note in pool.layout.notes:               # padding, padding layers: the layout's own
        assert note in log
    if preset == "nemotron-3-nano-30b-a3b":
        assert one(PADDING, log) == ("1", "4.35")     # as the real H200 log
    else:
        assert not PADDING.search(log)
    assert "'max_num_seqs'" not in log           # not launched with it: vLLM's default
    metrics = parse_metrics(httpx.get(s.url + "/metrics", timeout=10).text)
    assert (metrics.kv_capacity_tokens, metrics.block_size, metrics.num_gpu_blocks,
            metrics.prefix_caching) == (pool.capacity_tokens, pool.unit_tokens, blocks, False)


@pytest.mark.parametrize("preset", list(PRESETS))
def test_sglang_start_up_lines_state_the_pools(started, preset):
    s = started["sglang", preset]
    pool = pool_of("sglang", preset)
    log = s.log
    slots, conv, ssm = one(MAMBA, log)
    assert int(slots) == pool.state_slots
    # the state tensors hold one padding slot; conv + ssm is one request's state (2-decimal
    # rounding of each)
    state = (pool.state_slots + 1) * pool.layout.state_bytes / GIB
    assert float(conv) + float(ssm) == pytest.approx(state, abs=0.011)
    assert float(ssm) > 10 * float(conv)
    tokens, k, v = one(KV, log)
    assert int(tokens) == pool.capacity_tokens
    kv = (pool.capacity_tokens + 1) * PRESETS[preset] / GIB       # one padding row
    assert float(k) == float(v) == round(kv / 2, 2)
    cap, running, length = one(SUMMARY, log)
    assert (int(cap), int(running), int(length)) == (pool.capacity_tokens, pool.max_running,
                                                      262_144)
    facts = parse_log("sglang", log)
    assert facts.kv_capacity_tokens == pool.capacity_tokens
    assert facts.kv_cache_gib == pytest.approx(kv, abs=0.011)
    assert not REDUCED.search(log)               # no limit was asked for
    info = httpx.get(s.url + "/get_server_info", timeout=10).json()
    assert info["max_running_requests"] is None and info["max_mamba_cache_size"] is None
    state = info["internal_states"][0]
    assert (state["max_total_num_tokens"], state["effective_max_running_requests_per_dp"],
            state["max_mamba_cache_size"]) == (pool.capacity_tokens, pool.max_running,
                                               pool.state_slots)
    text = httpx.get(s.url + "/metrics", timeout=10).text
    assert parse_metrics(text).kv_capacity_tokens == pool.capacity_tokens
    assert sum(gauge(text, f"sglang:mamba_{k}_tokens")          # the state pool's slots
               for k in ("available", "evictable", "used")) == pool.state_slots


def test_qwen3_next_on_sglang_runs_66_by_default_as_the_real_engine():
    """331 state slots predicted, at most 66 running (slots // 5); the real H200 logs: 330 and
    66 (Triton block-FP8 GEMMs), 329 and 65 (DeepGEMM, which held 0.09 GB more at start)."""
    pool = pool_of("sglang", QWEN)
    assert pool.max_running == pool.state_slots // 5 == 66


def test_sglang_warns_when_the_state_slots_cut_a_requested_limit():
    pool = pool_of("sglang", QWEN, max_running=128)
    assert pool.max_running == 66
    s, = start_all(sim("sglang", QWEN, "--max-running-requests", "128"), timeout=120.0)
    try:
        assert one(REDUCED, s.log) == ("128", "66")
        assert one(SUMMARY, s.log)[1] == "66"
        info = httpx.get(s.url + "/get_server_info", timeout=10).json()
        assert info["max_running_requests"] == 128
        assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 66
    finally:
        s.stop()


# ----------------------------------------------------------------------- (b), (c) admission
def gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def most_at_once(proc: Proc, engine: str, count: int, prompt: int, max_tokens: int,
                 timeout: float = 60.0) -> tuple[int, int, int]:
    """Send ``count`` requests at once (``prompt`` token ids, ``max_tokens`` generated, so
    long that none finishes meanwhile), watch the running and waiting gauges until every
    request has arrived, then drop them all. Returns (most running seen, running and waiting
    once all arrived)."""
    running, waiting = RUNNING[engine]
    body = {"model": "m", "prompt": [1000 + i for i in range(prompt)],
            "max_tokens": max_tokens, "ignore_eos": True}
    if engine == "vllm":
        body["model"] = proc.args[proc.args.index("--model-name") + 1]

    async def scenario() -> tuple[int, int, int]:
        limits = httpx.Limits(max_connections=count + 4, max_keepalive_connections=count + 4)
        async with httpx.AsyncClient(base_url=proc.url, limits=limits,
                                     timeout=httpx.Timeout(timeout)) as client:
            tasks = [asyncio.ensure_future(client.post("/v1/completions", json=body))
                     for _ in range(count)]
            most, seen = 0, (0, 0)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            try:
                while loop.time() < deadline:
                    text = (await client.get("/metrics")).text
                    seen = (int(gauge(text, running)), int(gauge(text, waiting)))
                    most = max(most, seen[0])
                    if sum(seen) >= count:
                        break
                    for t in tasks:      # none may end: each runs for many seconds
                        if t.done():
                            r = t.result()
                            raise AssertionError(f"a request ended: {r.status_code} {r.text}")
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.2)           # admission settles: no more may start
                text = (await client.get("/metrics")).text
                seen = (int(gauge(text, running)), int(gauge(text, waiting)))
                most = max(most, seen[0])
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            return most, *seen

    return asyncio.run(scenario())


def expected_running(pool: Pool, tokens: int) -> int:
    return min(pool.max_running, int(pool.units // pool.units_for(tokens)))


@pytest.mark.parametrize(("engine", "count", "max_tokens"), [
    ("sglang", 90, 15_000),      # the state slots bind (66), not the KV tokens
    ("vllm", 40, 65_000),        # long requests: the pool of pages binds
])
def test_admission_follows_the_pool(started, engine, count, max_tokens):
    """More requests than the engine runs at once: no more than the pool admits run, the rest
    wait."""
    pool = pool_of(engine, QWEN)
    want = expected_running(pool, 16 + max_tokens)
    assert 10 <= want < count
    if engine == "sglang":
        assert want == pool.max_running == 66
    most, running, waiting = most_at_once(started[engine, QWEN], engine, count, 16, max_tokens)
    assert (most, running, waiting) == (want, want, count - want)


@pytest.mark.parametrize(("count", "prompt", "max_tokens", "share"), [
    (30, 16, 100_000, 0.0),      # few long sequences: the radix cache off, KV for more
    (100, 16, 4_000, 0.5),       # many short ones sharing prefixes: the state slots sized
])
def test_the_memory_knob_advice_raises_the_sequences_at_once(count, prompt, max_tokens, share):
    """SGLang on Qwen3-Next: the knobs a recommendation proposes for the workload
    (``instance_fit(..., advise=True)``, as ``Engine.knob_args`` writes them) let more of it
    run at once than the engine's defaults, in the simulator as in the model."""
    gpu, shape = builtin_gpu(GPU), shape_of(QWEN, "bf16", PRESETS[QWEN])
    default = instance_fit("sglang", FRACTION, gpu, shape, 1, 1, count, prompt, max_tokens,
                           share)
    advised = instance_fit("sglang", FRACTION, gpu, shape, 1, 1, count, prompt, max_tokens,
                           share, advise=True)
    flags = engine_record("sglang").knob_args(advised.knobs)
    assert flags and default.running < advised.running <= count
    knobbed = pool_of("sglang", QWEN, **advised.knobs._asdict())
    assert expected_running(knobbed, prompt + max_tokens) == advised.running
    # each request runs for tens of seconds at this scale: none ends while they are counted
    procs = start_all(sim("sglang", QWEN, scale="0.3"),
                      sim("sglang", QWEN, *flags, scale="0.3"), timeout=120.0)
    try:
        seen = [most_at_once(p, "sglang", count, prompt, max_tokens) for p in procs]
    finally:
        for p in procs:
            p.stop()
    assert seen == [(default.running, default.running, count - default.running),
                    (advised.running, advised.running, count - advised.running)], flags
