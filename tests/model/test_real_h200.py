"""The default model against the real vLLM 0.26.0 and SGLang 0.5.16 runs on one H200 it ships
with (model/data/h200_real.csv): every figure held out (engine_advisor.model.validation)."""

import pytest

from engine_advisor.model.fit.default import default_model, left_out_rows, real_rows, unfitted_rows
from engine_advisor.model.validation import (
    capacity_table,
    leave_model_out,
    summary,
    unseen_model_ratios,
)


@pytest.fixture(scope="module")
def s():
    return summary(default_model(), real_rows())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("quantity,limit", [("total", 0.10), ("ttft", 0.10), ("step", 0.15)])
def test_held_out_error_within_target_and_below_the_prior(s, engine, quantity, limit):
    e = s["errors"][f"{engine}/{quantity}"]
    assert e["points"] >= 16
    assert e["held_out"] <= limit
    assert e["held_out"] < e["prior"]


def test_no_point_group_is_worse_than_the_prior(s):
    """Per engine, model and quantity, the median held-out error is never above the prior's."""
    for g in s["groups"]:
        assert g["held_out"] <= g["prior"] + 1e-9, g


def test_kv_capacity_within_3_percent_of_the_engines_logs(s):
    assert {(c["engine"], c["model"]) for c in s["capacity"]} == {
        (e, m) for e in ("vllm", "sglang")
        for m in ("deepseek-v2-lite", "llama-3.1-8b", "qwen3-32b")}
    for c in s["capacity"]:
        assert abs(c["error"]) <= 0.03, c


def test_the_faster_engine_is_picked_and_the_ratio_is_right(s):
    c = s["choice"]
    assert c["points"] >= 30
    assert c["share_right"] >= 0.90
    assert c["differing_points"] >= 5 and c["ratio_median_factor"] <= 1.15
    # the prior (the physics at the engines' profiled kernel efficiencies, no end-to-end fit)
    # picks as well since SGLang's fused MoE has its measured multiples (31 of 44 before); the
    # fit still gets the ratio of the engines' times closer (1.03 against 1.04 x)
    assert s["choice_prior"]["share_right"] >= 0.90
    assert c["ratio_median_factor"] <= s["choice_prior"]["ratio_median_factor"]


def test_the_uncalibrated_prior_holds_against_the_real_runs(s):
    """Issue 26's bar for the prior on real runs: geometric-mean ratio within 1.15, at least
    85 % of figures within 2x, and every batch prefill within 2x."""
    r = s["prior_ratios"]
    assert r["figures"] >= 180
    assert 1 / 1.15 <= r["geomean"] <= 1.15
    assert r["within_2x"] >= 0.85
    assert r["ttft_outside_2x"] == 0


def test_the_prior_and_the_fit_hold_for_a_model_left_out():
    """Real vLLM runs of Qwen3-32B (64 layers, dense GQA with QK norms) on the H200, left out
    of the default model's data: the same bar for the prior, and for a fit on the other models,
    which predicts it with their efficiencies."""
    u = leave_model_out(left_out_rows("qwen3-32b"), "qwen3-32b")
    assert u["models"] == ["qwen3-32b"] and u["figures"] == 78
    assert u["engines_gpus"] == [("sglang", "H200"), ("vllm", "H200")]
    for name in ("prior", "transferred"):
        assert 1 / 1.15 <= u[name]["geomean"] <= 1.15, name
        assert u[name]["within_2x"] == 1.0, name
        assert 0.5 <= u[name]["ttft"][1] and u[name]["ttft"][2] <= 2.0, name


def _left_out(name: str, engine: str) -> dict:
    """``leave_model_out`` of one engine's runs of ``name``."""
    rows = [r for r in left_out_rows(name) if r.model != name or r.engine == engine]
    return leave_model_out(rows, name)


@pytest.mark.parametrize("engine,figures", [("vllm", 37), ("sglang", 39)])
def test_a_moe_left_out_holds_for_the_prior_and_the_transferred_fit(engine, figures):
    """Real runs of Qwen3-30B-A3B (48 GQA MoE layers, 128 experts, 8 per token) on the H200,
    shipped unfitted: issue 26's bar for the prior and for a fit on the other models (its
    efficiencies carried over), every batch prefill within 2x. SGLang 0.5.16 replays this
    model's prefill passes as CUDA graphs (33 ms to the first token of a 1,024-token prompt;
    vLLM, launching that pass kernel by kernel, 98 ms): without the engine's graphs in the
    prefill terms the prior put it at 96 ms."""
    u = _left_out("qwen3-30b-a3b", engine)
    assert u["models"] == ["qwen3-30b-a3b"] and u["figures"] == figures
    assert u["engines_gpus"] == [(engine, "H200")]
    for name in ("prior", "transferred"):
        assert 1 / 1.15 <= u[name]["geomean"] <= 1.15, name
        assert u[name]["within_2x"] == 1.0, name
        assert 0.5 <= u[name]["ttft"][1] and u[name]["ttft"][2] <= 2.0, name
        assert 0.5 <= u[name]["step"][1] and u[name]["step"][2] <= 2.0, name


@pytest.mark.parametrize("engine,figures", [("vllm", 37), ("sglang", 39)])
def test_mixtral_left_out_holds_for_the_prior_and_the_transferred_fit(engine, figures):
    """Real runs of Mixtral-8x7B (32 GQA MoE layers, 8 experts of 14,336 of which 2 per token,
    93 GB) on the H200, shipped unfitted: a third MoE, with few large experts where the others
    have many small ones. Issue 26's bar for the prior and the transferred fit, every batch
    prefill and decode step within 2x, and the KV capacity within 1 % of the engine's log
    (vLLM 296,352 tokens, SGLang 312,663). Measured 2026-12-02: vLLM prior 1.01x (batch prefill
    0.83-1.38x, decode step 0.94-1.16x), SGLang prior 0.955x (batch prefill 0.73-0.84x, decode
    step 1.01-1.23x): both engines prefill 64 x 1,024 tokens in 3.35-3.38 s, where the prior's
    routed-expert FLOPs (pf_moe) alone take 2.14 s and SGLang's whole prior 2.46 s."""
    u = _left_out("mixtral-8x7b", engine)
    assert u["models"] == ["mixtral-8x7b"] and u["figures"] == figures
    assert u["engines_gpus"] == [(engine, "H200")]
    for name in ("prior", "transferred"):
        assert 1 / 1.15 <= u[name]["geomean"] <= 1.15, name
        assert u[name]["within_2x"] == 1.0, name
        assert 0.5 <= u[name]["ttft"][1] and u[name]["ttft"][2] <= 2.0, name
        assert 0.5 <= u[name]["step"][1] and u[name]["step"][2] <= 2.0, name
    caps = [c for c in capacity_table(unfitted_rows())
            if c["model"] == "mixtral-8x7b" and c["engine"] == engine]
    assert len(caps) == 1 and abs(caps[0]["error"]) <= 0.01, caps


def test_a_model_the_fit_saw_is_not_unseen():
    with pytest.raises(ValueError, match="deepseek-v2-lite"):
        unseen_model_ratios(default_model(), real_rows()[:3])


@pytest.mark.slow
def test_each_models_random_router_has_its_own_diversity():
    """vLLM 0.26.0's random weights send DeepSeek-V2-Lite's decode batch to a few experts and
    spread Qwen3-30B-A3B's: the fit chooses a routing diversity per served model."""
    from engine_advisor.model.fit.fitting import choose_diversity
    from engine_advisor.model.fit.rows import trainable

    rows = [r for r in left_out_rows("qwen3-30b-a3b")
            if r.engine == "vllm" and r.gpu == "H200" and trainable(r)]
    rho, _ = choose_diversity(rows)
    assert rho["deepseek-v2-lite"] <= 0.1 < rho["qwen3-30b-a3b"]


def _median_errors(model, rows, name: str) -> dict[str, float]:
    """Median |predicted / measured - 1| of ``name``'s rows per quantity, predicted by
    ``model`` at its level for them; the decode step of batch-1 points only (a random-weight
    MoE's batches route as no trained router does)."""
    import numpy as np

    from engine_advisor.model.fit.fitting import QUANTITIES, observations
    from engine_advisor.model.fit.rows import row_shape

    held = [r for r in rows if r.model == name]
    obs = observations(held)
    out = {}
    for q, qname in enumerate(QUANTITIES):
        errs = []
        for i, j in enumerate(obs.row):
            r = held[j]
            if obs.qty[i] != q or (qname == "step" and r.batch_size > 1):
                continue
            level = model.level_for(r.engine, r.gpu, row_shape(r).key)
            errs.append(abs(model.engines[level].predict(obs.X[i:i + 1])[0] / obs.y[i] - 1))
        out[qname] = float(np.median(errs))
    return out


# Nemotron-3-Nano's rows per engine, fitted with the default model's data (held out point by
# point) and left out (the default model): each quantity's bound. Its linear layers' prefill
# starts from each engine's profiled SSD kernels (Engine.kernel_priors: vLLM 4.5 x the physics,
# SGLang 19.1 x), SGLang's fused MoE from its profiled kernels (1.5 x at a tuned configuration,
# 1.7 x that at its default one, which is Nemotron's: Engine.moe_kernel), the rest from the
# other models' efficiencies
HYBRID_BOUNDS = {
    # vLLM: 4.2 % (prefill), 3.7 % (decode step) fitted; left out 4.9 %, and the batch-1 decode
    # step 11 % slow (16 % while a step's fixed cost was priced per layer, not per kernel
    # launched: docs/validation.md, "Decode steps"; bench/real_engines/decode_floors.py)
    "vllm": ({"ttft": 0.10, "total": 0.10, "step": 0.10}, {"ttft": 0.10, "step": 0.15}),
    # SGLang: 2.4 % (prefill), 0.6 % (decode step) fitted; left out 10.6 % and 3.9 % (32 % in
    # prefill before its fused MoE had its measured multiples, 11 % in the step before its
    # fixed cost was priced per kernel)
    "sglang": ({"ttft": 0.10, "total": 0.10, "step": 0.10}, {"step": 0.10, "ttft": 0.15}),
}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_hybrid_holds_in_a_fit_and_left_out(engine):
    """Nemotron-3-Nano (23 Mamba2 and 6 attention layers, 128 experts) on a real vLLM 0.26.0
    and SGLang 0.5.16, shipped unfitted (bench/real_engines/rebuild_real.py says why), against
    the bounds above: fitted with the default model's data and held out point by point, and
    left out (this model's physics, the other models' efficiencies)."""
    from engine_advisor.model.fit.costmodel import CostModel
    from engine_advisor.model.fit.default import fitted_rows
    from engine_advisor.model.validation import error_table

    name = "nemotron-3-nano-30b-a3b"
    rows = [r for r in unfitted_rows() if r.model == name and r.engine == engine]
    # vLLM ran with --max-num-seqs 128; SGLang with its own limit (137 of 686 state slots)
    assert len(rows) == 10 and {r.max_running for r in rows} == {128 if engine == "vllm" else None}
    with_it = CostModel.fit(fitted_rows() + rows)
    fitted = {g["quantity"]: g["held_out"] for g in error_table(with_it, "H200")
              if g["model"] == name}
    outside = _median_errors(default_model(), rows, name)
    in_fit, left_out = HYBRID_BOUNDS[engine]
    for q, bound in in_fit.items():
        assert fitted[q] <= bound, (q, fitted)
    for q, bound in left_out.items():
        assert outside[q] <= bound, (q, outside)


# Qwen3-Next-80B-A3B-FP8's rows per engine, fitted (held out point by point) and left out (the
# default model), as HYBRID_BOUNDS. Fitted: 5.8 % / 1.6 % (vLLM prefill / step), 3.3 % / 2.0 %
# (SGLang). Left out: 5.7 % / 5.8 % (vLLM), 6.3 % / 4.1 % (SGLang): both engines run its
# block-FP8 experts on a slower kernel than bf16 ones (Engine.moe_kernel: vLLM 1.5 x, SGLang
# 1.8 x); before, 12 % and 30 % in prefill. SGLang's decode step is on DeepGEMM, its default
# block-FP8 GEMM (22 % when its Triton block-FP8 kernel ran at an untuned configuration:
# bench/real_engines/rebuild_real.py)
QWEN3_NEXT_BOUNDS = {"vllm": ({"ttft": 0.10, "total": 0.10, "step": 0.10},
                              {"step": 0.10, "ttft": 0.10, "total": 0.10}),
                     "sglang": ({"ttft": 0.10, "total": 0.10, "step": 0.10},
                                {"step": 0.05, "ttft": 0.10, "total": 0.10})}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_gated_deltanet_hybrid_in_a_fit_and_left_out(engine):
    """Qwen3-Next (36 Gated DeltaNet and 12 attention layers, 512 experts, block-FP8) on a
    real vLLM 0.26.0 (Triton GDN prefill) and SGLang 0.5.16, shipped unfitted, against the
    bounds above."""
    from engine_advisor.model.fit.costmodel import CostModel
    from engine_advisor.model.fit.default import fitted_rows
    from engine_advisor.model.validation import error_table

    name = "qwen3-next-80b-a3b-fp8"
    rows = [r for r in unfitted_rows() if r.model == name and r.engine == engine]
    assert len(rows) == 11
    fitted = {g["quantity"]: g["held_out"]
              for g in error_table(CostModel.fit(fitted_rows() + rows), "H200")
              if g["model"] == name}
    outside = _median_errors(default_model(), rows, name)
    in_fit, left_out = QWEN3_NEXT_BOUNDS[engine]
    for q, bound in in_fit.items():
        assert fitted[q] <= bound, (q, fitted)
    for q, bound in left_out.items():
        assert outside[q] <= bound, (q, outside)


@pytest.mark.parametrize("name", ["nemotron-3-nano-30b-a3b", "qwen3-next-80b-a3b-fp8"])
def test_the_faster_engine_is_picked_on_each_hybrid(name):
    """At each point both engines ran, the engine the default model (the hybrids left out)
    predicts faster took the less time, or within 5 % of the other's: every point of both
    (Nemotron 10, Qwen3-Next 11; 9 of 10 and 9 of 11 before SGLang's fused MoE had its
    profiled multiples, Nemotron 2 of 10 before its SSD kernels had theirs)."""
    from engine_advisor.model.fit.fitting import QUANTITIES, observations
    from engine_advisor.model.fit.rows import row_shape

    rows = [r for r in unfitted_rows() if r.model == name]
    model = default_model()
    totals = {}
    for r in rows:
        obs = observations([r])
        level = model.level_for(r.engine, r.gpu, row_shape(r).key)
        (i,) = [i for i in range(len(obs.y)) if QUANTITIES[obs.qty[i]] == "total"]
        totals[(r.context_tokens, r.batch_size, r.engine)] = (
            model.engines[level].predict(obs.X[i:i + 1])[0], obs.y[i])
    good = n = 0
    for (ctx, batch, engine), (pv, yv) in totals.items():
        if engine != "vllm" or (ctx, batch, "sglang") not in totals:
            continue
        ps, ys = totals[(ctx, batch, "sglang")]
        n += 1
        picked, other = (yv, ys) if pv <= ps else (ys, yv)
        good += picked <= other * 1.05
    assert n >= 10 and good == n, (good, n)
