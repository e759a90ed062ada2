"""Unit tests of the simulator's tokenizer, text plan and scheduler (no HTTP)."""

from __future__ import annotations

import asyncio

import pytest

from engine_advisor.model.fit.default import default_model
from engine_advisor.model.hardware.gpus import builtin_gpu
from engine_advisor.model.physics.shape import bare, preset_shape
from engine_advisor.sim import tokenizer
from engine_advisor.sim.engine import EngineCore, token_pool
from engine_advisor.sim.textgen import WORDS, plan_output
from engine_advisor.sim.timing import StepTimer


@pytest.mark.parametrize("text", ["", "hello world", "  leading spaces\tand\ttabs\n\n",
                                  "Zahlen 1234567 und Ümlaute, 日本語 ✓ 🙂", "a" * 1001,
                                  "<|im_start|>user\nhi<|im_end|>\n"])
def test_tokenizer_roundtrip(text):
    ids = tokenizer.encode(text)
    assert all(0 <= t < tokenizer.VOCAB_SIZE for t in ids)
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode(text) == ids


def test_tokenizer_cuts_short_pieces():
    pieces = [tokenizer.token_str(t) for t in tokenizer.encode("The quick brown fox")]
    assert pieces == ["The", " qui", "ck", " bro", "wn", " fox"]
    with pytest.raises(tokenizer.TokenError):
        tokenizer.decode([tokenizer.VOCAB_SIZE])
    assert tokenizer.check_ids([1, True]) is not None
    assert tokenizer.check_ids([0, tokenizer.VOCAB_SIZE - 1]) is None


def test_generated_words_are_single_tokens_and_retokenize_exactly():
    assert all(len(tokenizer.encode(w)) == 1 for w in WORDS)
    plan = plan_output(list(range(50)), server_seed=0, request_seed=None, max_tokens=300,
                       min_tokens=0, ignore_eos=True)
    assert tokenizer.encode(plan.text(0, 300)) == plan.token_ids(0, 300)


def test_plan_respects_max_min_and_seeds():
    kw = dict(server_seed=1, request_seed=None, min_tokens=0)
    ids = tokenizer.encode("some prompt")
    assert plan_output(ids, max_tokens=77, ignore_eos=True, **kw).n == 77
    natural = plan_output(ids, max_tokens=10_000, ignore_eos=False, **kw)
    assert natural.finish_reason == "stop" and natural.n < 10_000
    assert plan_output(ids, max_tokens=10_000, ignore_eos=False, **kw) == natural
    longer = plan_output(ids, max_tokens=10_000, ignore_eos=False, server_seed=1,
                         request_seed=None, min_tokens=natural.n + 3)
    assert longer.n == natural.n + 3
    capped = plan_output(ids, max_tokens=1, ignore_eos=False, **kw)
    assert (capped.n, capped.finish_reason) == (1, "length")
    other = plan_output(ids, max_tokens=50, ignore_eos=True, server_seed=2, request_seed=None,
                        min_tokens=0)
    assert other.text(0, 50) != plan_output(ids, max_tokens=50, ignore_eos=True, **kw).text(0, 50)


def _timer():
    return StepTimer(default_model(), "vllm", builtin_gpu("B300"),
                     preset_shape("kimi-k3", "bf16"), 8)


def test_step_time_grows_with_batch_and_context():
    t = _timer()
    assert t.step_s(64, 1000) > t.step_s(1, 1000)
    assert t.step_s(1, 200_000) > t.step_s(1, 1000)
    assert t.prefill_s(1, 100_000) > t.prefill_s(1, 1000)


def test_scheduler_queues_beyond_max_running_and_capacity():
    async def scenario():
        core = EngineCore(_timer(), token_pool(1000, 2), time_scale=0.2)
        core.start()
        reqs = [core.submit(100, 50) for _ in range(3)]
        big = core.submit(800, 100)          # fits alone, not beside the others
        await asyncio.sleep(0)
        for _ in range(200):
            await asyncio.sleep(0.001)
            if core.num_running == 2:
                break
        assert (core.num_running, core.num_waiting) == (2, 2)
        core.abort(reqs[0])
        assert core.num_running == 1 and reqs[0].aborted
        while not all(r.finished for r in reqs + [big]):
            await asyncio.sleep(0.005)
        assert [r.produced for r in reqs[1:]] == [50, 50] and big.produced == 100
        assert core.reserved == 0 and core.kv_used_tokens() == 0 and core.kv_usage() == 0
        assert core.stats.generation_tokens == 200 + reqs[0].produced
        await core.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_admit_window_times_a_burst_from_its_first_arrival():
    """A burst whose requests reach the engine over 60 ms (the HTTP layer hands them over one
    by one) is prefilled together and timed from the first one's receipt: the first tokens come
    one scaled prefill after it, the window adding nothing while it is shorter than the
    prefill. A window longer than the prefill delays them to its end."""
    timer = _timer()

    async def burst(window: float, scale: float) -> tuple[list, float]:
        core = EngineCore(timer, token_pool(10**7, 64), time_scale=scale,
                          admit_window_s=window)
        core.start()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        reqs = [core.submit(2048, 2, received=t0)]
        for _ in range(3):
            await asyncio.sleep(0.02)
            reqs.append(core.submit(2048, 2, received=loop.time() - 0.005))
        while not all(r.produced for r in reqs):
            await asyncio.sleep(0.002)
        await core.stop()
        return [r.first_token_at - t0 for r in reqs], core.stats.queue.count

    prefill = timer.prefill_s(4, 2048)          # ~0.24 s, batch 1 ~0.065 s
    scale = 0.5 / prefill
    firsts, _ = asyncio.run(burst(0.2, scale))
    assert max(firsts) - min(firsts) < 1e-9                      # one prefill for all four
    assert 0.5 <= firsts[0] < 0.5 + 0.05                         # not 0.2 + 0.5
    firsts, _ = asyncio.run(burst(0.3, 0.1 / prefill))
    assert 0.3 <= firsts[0] < 0.3 + 0.05                         # the window's end


def test_cli_defaults_are_the_configs_defaults():
    """`engine-advisor sim` keeps its defaults as literals (importing engine_advisor.sim.config
    would slow every CLI command's start-up by ~170 ms): they must not drift from SimConfig's."""
    import dataclasses

    from engine_advisor.cli.main import build_parser
    from engine_advisor.sim.config import SimConfig

    args = vars(build_parser().parse_args(["sim", "--engine", "vllm", "--port", "1"]))
    renamed = {"model_artifact": "model", "custom_gpu": "gpu_spec"}
    for f in dataclasses.fields(SimConfig):
        if f.name in ("engine", "port"):
            continue
        assert args[renamed.get(f.name, f.name)] == f.default, f.name


@pytest.mark.parametrize("gpu", ["B300", "H200"])     # H200: a measured DCP profile exists
def test_step_time_is_the_recommenders_tpot(gpu):
    """The simulator's decode step is what the recommender predicts as TPOT for the same
    workload, including the combine cost a GPU's measured DCP profile shapes."""
    from engine_advisor.model.recommend import recommend
    from engine_advisor.model.workload import Workload

    m = default_model()
    w = Workload(context_tokens=131_072, output_tokens=2, batch_size=16,
                 kv_bytes_per_token=70_272, gpu=gpu, num_gpus=8, engines=["sglang"],
                 dcp_sizes=[8], allow_extrapolation=True)
    tpot = next(p.tpot_s for p in recommend(m, w, "v").predictions if p.dcp_size == 8)
    timer = StepTimer(m, "sglang", builtin_gpu(gpu), bare(70_272), 8, dcp=8)
    # the recommender reads KV at the mean decode context: context + output / 2
    assert timer.step_s(16, 131_073) == pytest.approx(tpot, rel=1e-9)


def test_a_lone_surrogate_is_a_token_error_not_a_crash():
    from engine_advisor.sim.tokenizer import TokenError, decode, encode
    with pytest.raises(TokenError, match="lone surrogate \\\\ud800"):
        encode("hi \ud800 there")
    assert decode(encode("hi \U0001f600")) == "hi \U0001f600"       # a pair is a character


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_hybrids_step_time_is_the_recommenders_tpot(engine):
    """Qwen3-Next's decode step reads and writes each sequence's GDN state as the engine holds
    it (vLLM bf16, SGLang fp32): the simulator's step is the recommender's TPOT."""
    from engine_advisor.model.physics.shape import shape_of
    from engine_advisor.model.recommend import recommend
    from engine_advisor.model.workload import Workload

    m = default_model()
    w = Workload(context_tokens=8192, output_tokens=2, batch_size=16,
                 preset="qwen3-next-80b-a3b-fp8", gpu="H200", num_gpus=1, engines=[engine],
                 allow_extrapolation=True)
    tpot = next(p.tpot_s for p in recommend(m, w, "v").predictions if p.engine == engine)
    timer = StepTimer(m, engine, builtin_gpu("H200"),
                      shape_of("qwen3-next-80b-a3b-fp8", "bf16", 24_576), 1)
    assert timer.state_bytes == {"vllm": 36 * 1_097_728, "sglang": 77_266_944}[engine]
    assert timer.step_s(16, 8193) == pytest.approx(tpot, rel=1e-9)


def test_scheduler_admits_by_the_pools_units():
    """A pool of pages (vLLM's for a hybrid): a request of n tokens takes ceil(n / block)
    pages of KV and 3 of state; at most as many run as their pages fit."""
    from engine_advisor.model.engines.base import PAGED, StateLayout
    from engine_advisor.model.physics.capacity import Pool

    pool = Pool(20.0, 544.0, 1.0, 3.0, 100, 10_000, 0,
                StateLayout(PAGED, state_bytes=1.0, unit_bytes=1.0, block_tokens=544,
                            state_units=3))

    async def scenario():
        core = EngineCore(_timer(), pool, time_scale=0.2)
        assert core.fits(544 * 17, 0) and not core.fits(544 * 17 + 1, 0)
        core.start()
        reqs = [core.submit(900, 100) for _ in range(5)]        # 2 + 3 = 5 pages each
        for _ in range(200):
            await asyncio.sleep(0.001)
            if core.num_running == 4:
                break
        assert (core.num_running, core.num_waiting) == (4, 1)
        assert core.reserved == 20 and core.kv_usage() == 1.0
        core.abort(reqs[0])
        for _ in range(200):
            await asyncio.sleep(0.001)
            if core.num_waiting == 0:
                break
        assert (core.num_running, core.num_waiting) == (4, 0)
        for r in reqs:
            core.abort(r)
        assert core.reserved == 0 and core.kv_usage() == 0
        await core.stop()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_memory_knobs_as_the_engines_spell_them():
    """--max-running and its engine spellings, SGLang's state knobs, --disable-radix-cache;
    each invalid value a '--flag: reason' problem."""
    from engine_advisor.cli.main import build_parser
    from engine_advisor.cli.sim import config_of
    from engine_advisor.model.engines.base import MemoryKnobs

    def cfg(*args):
        return config_of(build_parser().parse_args(["sim", "--port", "1", *args]))

    assert cfg("--engine", "vllm").knobs() == MemoryKnobs()
    assert cfg("--engine", "vllm", "--max-num-seqs", "64").knobs() == MemoryKnobs(64)
    sg = cfg("--engine", "sglang", "--max-running-requests", "21", "--disable-radix-cache",
             "--max-mamba-cache-size", "40", "--mamba-full-memory-ratio", "0.5")
    assert sg.problems() == []
    assert sg.knobs() == MemoryKnobs(21, 40, True, 0.5)
    assert cfg("--engine", "vllm", "--disable-radix-cache").disable_prefix_caching
    assert cfg("--engine", "vllm", "--disable-radix-cache").knobs() == MemoryKnobs()
    bad = cfg("--engine", "sglang", "--max-running", "0", "--max-mamba-cache-size", "0",
              "--mamba-full-memory-ratio", "11").problems()
    assert [p.split(":")[0] for p in bad] == ["--max-running", "--max-mamba-cache-size",
                                             "--mamba-full-memory-ratio"]
    for ratio in ("0", "-1", "nan", "inf"):
        assert cfg("--engine", "sglang", "--mamba-full-memory-ratio", ratio).problems() == [
            f"--mamba-full-memory-ratio: {float(ratio)} is outside (0, 10]"]
    assert cfg("--engine", "vllm", "--max-mamba-cache-size", "8").problems() == [
        "--max-mamba-cache-size: SGLang's flag; vllm has no separate state pool"]
