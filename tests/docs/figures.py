"""The figures and generated tables the pages quote, computed from the code.

``FIGURES[name](ctx)`` returns the text a page's ``<!--fig:name-->`` or ``<!--gen:name-->``
marker must hold; ``ctx`` gives the running service (``ctx.server.post``) to figures that
quote an endpoint. A figure whose premise no longer holds (another engine wins, say) raises
``Premise``, and the page's prose needs an edit by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

FIGURES: dict[str, Callable] = {}
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


class Premise(Exception):
    """The page's wording around a figure no longer describes the code's answer."""


def figure(name: str):
    def register(fn):
        FIGURES[name] = fn
        return fn
    return register


def _g(x: float, places: int = 1) -> str:
    """1,307.4 / 989 / 7.75: thousands separated, trailing zeros dropped."""
    s = f"{x:,.{places}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def _billions(x: float) -> str:
    """Parameters as the presets table writes them: 8.03 B, 70.6 B, 2,779.5 B."""
    b = x / 1e9
    return f"{b:.2f} B" if b < 10 else f"{b:,.1f} B"


# ---------------------------------------------------------------- shared answers
@cache
def _rec(preset: str, context: int, output: int, batch: int, gpu: str = "B300",
         num_gpus: int = 8):
    from engine_advisor.model.fit.default import default_model
    from engine_advisor.model.recommend import recommend
    from engine_advisor.model.workload import Workload

    m = default_model()
    return recommend(m, Workload(preset=preset, context_tokens=context, output_tokens=output,
                                 batch_size=batch, gpu=gpu, num_gpus=num_gpus), m.version)


def _pred(rec, engine: str, dcp: int):
    return next(p for p in rec.predictions if (p.engine, p.dcp_size) == (engine, dcp))


def _readme_rec():
    return _rec("kimi-k3", 204_800, 2048, 64)


def _rival(rec):
    """The best eligible prediction of the other engine (the one ``speedup`` compares to)."""
    total = _pred(rec, rec.engine, rec.dcp_size).total_s * rec.speedup
    return min((p for p in rec.predictions if p.engine != rec.engine),
               key=lambda p: abs(p.total_s - total))


# ---------------------------------------------------------------- validation.md, cost-model.md
@figure("validation.real")
def validation_real(ctx) -> str:
    """The held-out tables of the real H200 runs (engine_advisor.model.validation)."""
    from engine_advisor.model.fit.default import default_model, real_rows
    from engine_advisor.model.validation import markdown, summary

    return markdown(summary(default_model(), real_rows()))


@figure("validation.unseen")
def validation_unseen(ctx) -> str:
    """The prior and a fit on the other models against the real runs of each model left out."""
    from engine_advisor.model.fit.default import LEFT_OUT, left_out_rows
    from engine_advisor.model.validation import leave_model_out, unseen_markdown

    return "\n\n".join(unseen_markdown(leave_model_out(left_out_rows(n), n)) for n in LEFT_OUT)


@figure("costmodel.seed")
def seed_table(ctx) -> str:
    """The assumptions consistent with the published B300 times
    (engine_advisor.model.fit.seedcheck), and what two questions about the seed's model away from
    its workload get from the default model fitted under each (other models do not inherit the seed:
    ``CostModel.level_for``)."""
    from engine_advisor.model.fit.costmodel import CostModel
    from engine_advisor.model.fit.dataset import read_csv
    from engine_advisor.model.fit.default import REFERENCE_CSV, real_rows
    from engine_advisor.model.fit.seedcheck import choose, scan, with_assumption
    from engine_advisor.model.recommend import recommend
    from engine_advisor.model.workload import Workload

    verdicts = scan()
    best = choose(verdicts)
    published = read_csv(REFERENCE_CSV)
    kimi = Workload(preset="kimi-k3", gpu="B300", num_gpus=8, context_tokens=131_072,
                    output_tokens=2048, batch_size=64)
    step = Workload(preset="kimi-k3", gpu="B300", num_gpus=8, context_tokens=131_072,
                    output_tokens=1024, batch_size=8, engines=["sglang"], dcp_sizes=[8],
                    allow_extrapolation=True)
    out = ["| prompts | batch × output | departure | what the fit needs (coefficient / prior) "
           "| Kimi-K3, 64 × 2,048 at 128K: best (crossover) | Kimi-K3, SGLang DCP 8, "
           "8 × 1,024 at 128K: TPOT |", "|---|---|---|---|---|---|"]
    ok = sorted((v for v in verdicts if v.consistent), key=lambda v: v.distance)
    for v in ok[:8]:
        a = v.assumption
        size = f"{a.batch_size} × {a.output_tokens:,}"
        if v is best:
            size = f"**{size}** (used)"
        needs = ", ".join(f"{k} {r:.2f} ×" for k, r in sorted(v.freed.items()))
        m = CostModel.fit(with_assumption(published, a) + real_rows())
        k = recommend(m, kimi, "seed")
        tpot = recommend(m, step, "seed").predictions[0].tpot_s
        cross = f"{k.crossover_context_tokens:,}" if k.crossover_context_tokens else "none"
        out.append(f"| {a.prompts} | {size} | {v.distance:.2f} | {needs} | "
                   f"{ENGINE_NAMES[k.engine]} DCP {k.dcp_size} ({cross}) | {tpot * 1e3:.0f} ms |")
    if len(ok) > 8:
        out.append(f"| ({len(ok) - 8} more) | | {ok[8].distance:.2f} and more | | | |")
    return "\n".join(out)


@figure("validation.published")
def validation_published(ctx) -> str:
    """Every published row with the default model's predicted / published ratio
    (tests/model/test_published.py computes both)."""
    from tests.model import test_published as tp

    out = ["| id | source | model | GPU | engine | TP / DCP | context | batch | metric | "
           "published | predicted / published |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in tp.ROWS:
        source = f"[{r['source']}]({r['url']})" if r["url"] else r["source"]
        try:
            ratio = f"{tp.predicted(r['id']) / r['value']:.2f}"
            if r["id"] in tp.KNOWN_MISSES:
                ratio += " (known miss)"
            elif r["id"] in tp.DIRECTION_MISSES:
                ratio += " (DCP's direction: known miss)"
        except tp.Unsupported as exc:
            ratio = f"not evaluated: {exc}"
        out.append(f"| {r['id']} | {source} | {r['model']} | {r['gpu']} | {r['engine']} "
                   f"{r['engine_version']} | {r['tp']} / {r['dcp']} | {r['context_tokens']:,} | "
                   f"{r['batch']} | {r['metric']} | {_g(r['value'], 3)} | {ratio} |")
    return "\n".join(out)


# ---------------------------------------------------------------- README
@figure("readme.rival_running")
def readme_rival_running(ctx) -> str:
    return str(_rival(_readme_rec()).running_sequences)


@figure("readme.rival")
def readme_rival(ctx) -> str:
    r = _rival(_readme_rec())
    return f"{ENGINE_NAMES[r.engine]} dcp {r.dcp_size}"


# ---------------------------------------------------------------- proxy.md
@figure("proxy.crossover")
def proxy_crossover(ctx) -> str:
    """/v1/crossover for the example pools file's workload and groups (vLLM dcp 1, SGLang
    dcp 8: the two calibrated ones of vllm/sglang x dcp 1/8)."""
    r = ctx.server.post("/v1/crossover", {
        "preset": "kimi-k3", "gpu": "B300", "num_gpus": 8, "batch_size": 64,
        "output_tokens": 2048, "engines": ["vllm", "sglang"], "dcp_sizes": [1, 8]})
    body = r.json()
    if r.status_code != 200:
        raise Premise(f"/v1/crossover answered {r.status_code}: {body}")
    flips = body["engine_crossovers"]
    if len(flips) != 1 or (flips[0]["before"], flips[0]["after"]) != (
            {"engine": "vllm", "dcp_size": 1}, {"engine": "sglang", "dcp_size": 8}):
        raise Premise(f"the page says vLLM dcp 1 wins below one crossover and SGLang dcp 8 "
                      f"above; /v1/crossover says {flips}")
    return f"{flips[0]['context_tokens']:,}"


# ---------------------------------------------------------------- cost-model.md
@figure("cost.nofit.dsv3")
def nofit_dsv3(ctx) -> str:
    """The quoted parts of the refusal for DeepSeek-V3 on 8 x H100."""
    from engine_advisor.model.errors import NoEligibleConfiguration
    from engine_advisor.model.fit.default import default_model
    from engine_advisor.model.recommend import recommend
    from engine_advisor.model.workload import Workload

    m = default_model()
    w = Workload(preset="deepseek-v3", gpu="H100", num_gpus=8, context_tokens=1024,
                 output_tokens=128)
    try:
        recommend(m, w, m.version)
    except NoEligibleConfiguration as exc:
        msg = str(exc)
    else:
        raise Premise("DeepSeek-V3 now fits on 8 x H100")
    head = msg[msg.index("its weights take"):msg.index(" per GPU") + len(" per GPU")]
    return f"{head} … {msg[msg.index('it would fit with'):]}"


# ---------------------------------------------------------------- architecture.md
def _main_dtype(d: dict) -> str:
    """The checkpoint's main weight dtype: the largest part's, and what the rest use when
    more than 5 % of the bytes are stored otherwise."""
    by = {k: v for k, v in d["weight_bytes_by_part"].items() if v > 0}
    top = max(by, key=by.get)
    main = d["part_dtypes"][top]
    rest = {d["part_dtypes"][k] for k in by if k != top} - {main}
    other = sum(v for k, v in by.items() if d["part_dtypes"][k] != main)
    if len(rest) == 1 and other > 0.05 * sum(by.values()):
        return f"{main} ({top.replace('_', ' ')}), {rest.pop()} elsewhere"
    return main


@figure("arch.presets")
def presets_table(ctx) -> str:
    from engine_advisor.model.arch import PRESETS, preset

    out = ["| preset | layers (full / linear) | attention | KV B/token (bf16) | state B/seq | "
           "params | weight bytes | main weight dtype | active params/token |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name in PRESETS:
        d = preset(name).to_dict()
        out.append(f"| {name} | {d['n_layers']} ({d['n_full_attn_layers']} / "
                   f"{d['n_linear_layers']}) | {d['attention'].upper()} | "
                   f"{d['kv_bytes_per_token']:,} | {d['state_bytes_per_seq']:,} | "
                   f"{_billions(d['total_params'])} | {d['weight_bytes'] / 1e9:,.1f} GB | "
                   f"{_main_dtype(d)} | {_billions(d['active_params_per_token'])} |")
    return "\n".join(out)


@figure("arch.gpus")
def gpu_table(ctx) -> str:
    from engine_advisor.model.hardware.gpus import BUILTIN_GPUS

    def tf(x):
        return _g(x / 1e12) if x else "–"

    out = ["| GPU | memory (bytes) | HBM (TB/s) | scale-up per direction (GB/s) | "
           "dense BF16 / FP8 / FP4 (TFLOP/s) |", "|---|---|---|---|---|"]
    for g in BUILTIN_GPUS.values():
        out.append(f"| {g.name} | {g.memory_bytes:,.0f} | {_g(g.hbm_bandwidth / 1e12, 2)} | "
                   f"{_g(g.nvlink_bandwidth / 1e9)} | {tf(g.flops_bf16)} / {tf(g.flops_fp8)} / "
                   f"{tf(g.flops_fp4)} |")
    return "\n".join(out)


def _k3() -> dict:
    from engine_advisor.model.arch import preset
    return preset("kimi-k3").to_dict()


for _name, _fn in (
        ("kv_bf16", lambda d: f"{d['kv_bytes_per_token']:,}"),
        ("kv_fp8", lambda d: f"{d['kv_bytes_per_token'] // 2:,}"),
        ("state", lambda d: f"{d['state_bytes_per_seq']:,}"),
        ("params", lambda d: _billions(d["total_params"])),
        ("weights", lambda d: f"{d['weight_bytes'] / 1e9:,.1f}"),
        ("routed", lambda d: f"{d['weight_bytes_by_part']['routed_experts'] / 1e9:,.1f}"),
        ("kda", lambda d: f"{d['weight_bytes_by_part']['linear_attention'] / 1e9:,.1f}"),
        ("shared", lambda d: f"{d['weight_bytes_by_part']['shared_experts'] / 1e9:,.1f}"),
        ("mla", lambda d: f"{d['weight_bytes_by_part']['attention'] / 1e9:,.1f}"),
        ("per_gpu", lambda d: f"{d['weight_bytes'] / 8 / 1e9:,.1f}")):
    def _register_k3(name=_name, fn=_fn):
        @figure(f"arch.k3.{name}")
        def k3(ctx) -> str:
            return fn(_k3())
    _register_k3()


# ---------------------------------------------------------------- silicon-profiles.md
@figure("silicon.sources")
def silicon_sources(ctx) -> str:
    """Where each built-in GPU's physics comes from
    (``engine_advisor.model.hardware.silicon.silicon_for``)."""
    from engine_advisor.model.hardware.gpus import BUILTIN_GPUS
    from engine_advisor.model.hardware.silicon import silicon_for

    parts = ("kv_read", "gemm", "attn_flops", "collectives", "dcp_collectives")
    out = ["| GPU | KV read | GEMM | prefill attention | collectives | DCP collectives |",
           "|---|---|---|---|---|---|"]
    for g in BUILTIN_GPUS.values():
        src = silicon_for(g).sources
        cells = [src.get(p, "spec" if p != "dcp_collectives" else "from collectives")
                 .removeprefix("profile:") for p in parts]
        out.append(f"| {g.name} | " + " | ".join(f"`{c}`" if c.endswith(".json") else c
                                               for c in cells) + " |")
    return "\n".join(out)


@figure("arch.k3.memory")
def k3_memory(ctx) -> str:
    """How each engine holds Kimi-K3 on 8 x B300 at 0.92, DCP 1 and 8
    (engine_advisor.model.physics.capacity), and how many of 64 sequences of 204,800 + 2,048 tokens
    run at once, with the engines' defaults and with the knobs a recommendation proposes."""
    from engine_advisor.model.hardware.gpus import builtin_gpu
    from engine_advisor.model.physics.capacity import instance_fit, instance_pool
    from engine_advisor.model.physics.shape import preset_shape

    shape, gpu = preset_shape("kimi-k3", "bf16"), builtin_gpu("B300")
    out = ["| engine | DCP | pool | KV tokens | 64 × 204,800 at once: defaults | "
           "with the proposed knobs |", "|---|---|---|---|---|---|"]
    for engine in ("vllm", "sglang"):
        for dcp in (1, 8):
            p = instance_pool(engine, 0.92, gpu, shape, 8, dcp)
            if engine == "vllm":
                pool = (f"{int(p.units + 1):,} pages of {p.layout.block_tokens:,.0f} tokens, "
                        f"{p.layout.attn_units:.0f} + {p.layout.state_units:.0f} groups")
            else:
                pool = f"{p.state_slots:,} state slots, at most {p.max_running:,} running"
            d = instance_fit(engine, 0.92, gpu, shape, 8, dcp, 64, 204_800, 2048)
            a = instance_fit(engine, 0.92, gpu, shape, 8, dcp, 64, 204_800, 2048, advise=True)
            flags = " ".join(ENGINE_FLAGS(engine, a.knobs)) or "none"
            out.append(f"| {ENGINE_NAMES[engine]} | {dcp} | {pool} | {p.capacity_tokens:,} | "
                       f"{d.running} ({d.limit}) | {a.running} (`{flags}`) |")
    return "\n".join(out)


def ENGINE_FLAGS(engine: str, knobs) -> list[str]:  # noqa: N802 - a table's column
    from engine_advisor.model import engines

    return engines.get(engine).knob_args(knobs)


@figure("validation.kernels")
def validation_kernels(ctx) -> str:
    """The real engines' prefill kernels per cost term (bench/real_engines/kernels.py)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench/real_engines/kernels.py"
    spec = importlib.util.spec_from_file_location("bench_real_engines_kernels", path)
    kernels = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernels)
    return kernels.markdown(kernels.table())


# ---------------------------------------------------------------- trtllm-validation.md
SEED_CONTEXTS = (65_536, 204_800)


def _seed_three(context: int, extrapolate: bool):
    from engine_advisor.model.fit.default import default_model
    from engine_advisor.model.recommend import recommend
    from tests import seedload

    m = default_model()
    return recommend(m, seedload.workload(context, engines=["vllm", "sglang", "trtllm"],
                                          allow_extrapolation=extrapolate), m.version)


@figure("trtllm.seed")
def trtllm_seed(ctx) -> str:
    """The seed's workloads (Kimi-K3, 8 distinct prompts + 4,096 output tokens on 8 x B300) with
    all three engines: each engine's DCP 1 and DCP 8 (TensorRT-LLM's Helix), the
    recommendation among calibrated configurations and with extrapolation allowed."""
    from engine_advisor.model import engines

    out = ["| context | engine | DCP | total s | prefill s | TPOT ms | rank | calibrated |",
           "|---|---|---|---|---|---|---|---|"]
    picks = []
    for context in SEED_CONTEXTS:
        rec = _seed_three(context, extrapolate=False)
        loose = _seed_three(context, extrapolate=True)
        order = [(p.engine, p.dcp_size) for p in rec.predictions]
        for engine in ("vllm", "sglang", "trtllm"):
            for dcp in (1, 8):
                p = _pred(rec, engine, dcp)
                out.append(f"| {context:,} | {engines.get(engine).label} | {dcp} | "
                           f"{_g(p.total_s)} | {_g(p.prefill_s)} | {_g(p.tpot_s * 1e3)} | "
                           f"{order.index((engine, dcp)) + 1} | "
                           f"{'yes' if p.calibrated else 'no'} |")
        picks.append(f"{context:,}: {engines.get(rec.engine).label} DCP {rec.dcp_size} "
                     f"(with `--allow-extrapolation`: {engines.get(loose.engine).label} DCP "
                     f"{loose.dcp_size})")
    if [(_seed_three(c, False).engine, _seed_three(c, False).dcp_size)
            for c in SEED_CONTEXTS] != [("vllm", 1), ("sglang", 8)]:
        raise Premise("the page says the calibrated recommendation stays the seed's "
                      "(vLLM DCP 1 at 64K, SGLang DCP 8 at 200K) with TensorRT-LLM ranked")
    if [(_seed_three(c, True).engine, _seed_three(c, True).dcp_size)
            for c in SEED_CONTEXTS] != [("sglang", 1), ("trtllm", 8)]:
        raise Premise("the page says that with --allow-extrapolation SGLang DCP 1 is "
                      "recommended at 64K and TensorRT-LLM's DCP 8 (Helix) at 200K")
    return "\n".join(out) + "\n\nRecommended: " + "; ".join(picks) + "."


@figure("trtllm.published")
def trtllm_published(ctx) -> str:
    """The published TensorRT-LLM rows with the default model's predicted / published ratio
    (tests/model/test_published.py computes both)."""
    from tests.model import test_published as tp

    out = ["| id | GPU | TP | context | batch | metric | published | predicted | "
           "predicted / published |", "|---|---|---|---|---|---|---|---|---|"]
    for r in tp.ROWS:
        if r["engine"] != "trtllm":
            continue
        pred = tp.predicted(r["id"])
        ratio = f"{pred / r['value']:.2f}" + (" (known miss)" if r["id"] in tp.KNOWN_MISSES
                                              else "")
        out.append(f"| {r['id']} | {r['gpu']} | {r['tp']} | {r['context_tokens']:,} | "
                   f"{r['batch']} | {r['metric']} | {_g(r['value'], 2)} | {_g(pred, 2)} | "
                   f"{ratio} |")
    return "\n".join(out)
