"""A decision in sentences: what was chosen and why, in the bytes and seconds of its decode
step, what the answer rests on, and how sure it is."""

from __future__ import annotations

from operator import itemgetter

from engine_advisor.model import engines
from engine_advisor.model.decision.choose import Decision
from engine_advisor.model.decision.crossover import TIE
from engine_advisor.model.engines.sglang import STATE_RATIO
from engine_advisor.model.fit.costmodel import UNCALIBRATED_REL_SIGMA
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.predict.query import Evaluated
from engine_advisor.model.workload import Workload


def _label(e: Evaluated) -> str:
    return f"{e.config.engine} dcp {e.config.dcp_size}"


def _share(x: float) -> str:
    """'37%', or 'under 1%' / 'over 99%' where rounding would say 0 % or 100 % of a part that
    is there."""
    if 0.0 < x < 0.005:
        return "under 1%"
    if 0.995 <= x < 1.0:
        return "over 99%"
    return f"{x:.0%}"


_second = itemgetter(1)

STEP_NAMES = {"gemm": "dense weights/GEMMs", "moe": "routed experts", "kv_read": "KV reads",
              "mla_read": "MLA latent reads", "dcp_read": "DCP attention reads",
              "state": "linear-attention state", "tp_comm": "TP all-reduce",
              "dcp_comm": "DCP collectives", "dcp_fixed": "DCP merge fixed",
              "kernel_fixed": "kernel launches",
              "moe_fixed": "MoE-layer fixed", "seq_fixed": "per-sequence",
              "step_fixed": "per-step fixed"}


_STEP_FORMATS = {k: name + " %.1f ms" for k, name in STEP_NAMES.items()}


def step_story(parts: dict[str, float]) -> str:
    """'weights 12.0 ms, KV reads 4.1 ms, ...' of one decode step, largest first."""
    items = sorted(parts.items(), key=_second, reverse=True)
    return ", ".join([_STEP_FORMATS[k] % (v * 1e3) for k, v in items if v > 0])




# what binds the running sequences (ConfigPrediction.running_limit), as a sentence's subject
LIMIT_WORDS = {"kv": "KV capacity {p.kv_capacity_tokens:,} tokens",
               "state": "the linear-attention state pool",
               "max_running": "the running-request limit",
               "none": "memory"}


def memory_story(w: Workload, shape: ModelShape, gpu: str, e: Evaluated) -> str:
    """Why the prediction sets its engine's memory flags (``ConfigPrediction.memory_flags``),
    with the sequences the engine's defaults would run where the flags change that."""
    p = e.pred
    flags = " ".join(p.memory_flags)
    engine = engines.get(e.config.engine)
    if engine.max_running_flag == p.memory_flags[0] and len(p.memory_flags) == 2:
        if not shape.n_linear_layers:
            return (f"{flags}: the batch of {w.batch_size} exceeds {engine.label}'s default "
                    "running-request limit")
        return (f"{flags}: {engine.label} keeps linear-attention state and KV in one pool of "
                f"pages; {p.running_sequences} sequences fit, and a limit at what fits keeps "
                "its profiled activations and CUDA graphs to that many (its default is "
                f"{engine.default_running(w.gpu_spec().memory_bytes / 2 ** 30)})")
    run0, cap0, limit0 = e.defaults
    why = ("one state slot per request instead of five (no prefix reuse asked for)"
           if "--disable-radix-cache" in p.memory_flags else
           "state slots for these requests and the rest of the memory to KV")
    return (f"{flags}: {why}; {p.running_sequences} of {w.batch_size} sequences run at once "
            f"({p.kv_capacity_tokens:,} KV tokens), where {engine.label}'s default split "
            f"(state : KV {STATE_RATIO:g} : 1) holds {run0} ({cap0:,} KV tokens, limited by "
            f"{limit0.replace('_', ' ')})")


KV_ONLY = ("only KV bytes per token are known (no preset or config.json): weights, FLOPs and "
           "per-layer costs are not modelled, so KV capacity is an upper bound and the interval "
           "is widened")
SAME_PRIOR = ("the prior gives both engines the same efficiencies: only their memory (KV "
              "capacity, reserve) and the kernels each launches in a decode step tell them "
              "apart here, so the choice between them is not informed by measurements")


def trust_reasons(w: Workload, gpu: str, weights_known: bool, best: Evaluated,
                  rival: Evaluated | None, prior_why: str | None) -> list[str]:
    """What a choice of ``best`` over ``rival`` rests on, one list of sentences for
    ``/v1/recommend`` and ``/v1/plan`` (their confidence is
    ``engine_advisor.model.decision.choose.trust``'s): that only the KV bytes per token are
    known; then a transferred calibration, or the physics prior (``prior_why``: why; and, when
    ``rival`` is of another engine within 0.5 %, that the prior cannot tell the engines apart),
    or no calibration data (``allow_extrapolation``), or a workload outside the calibrated
    range."""
    bp = best.pred
    best_l = _label(best)
    r = [] if weights_known else [KV_ONLY]
    if bp.transferred:
        r.append(f"{best_l} is calibrated on {gpu} x {w.num_gpus} for other "
                 f"models: this model's physics with the engine's fitted efficiencies "
                 "(transferred; interval widened)")
    elif prior_why:
        names = best_l + (f" and {_label(rival)}" if rival else "")
        r.append(f"answered from the physics prior: {prior_why}, so every prediction uses the "
                 f"engines' prior efficiencies and their intervals are widened "
                 f"(+{UNCALIBRATED_REL_SIGMA:.0%} relative sd); calibrate {names} on "
                 f"{gpu} x {w.num_gpus} near "
                 f"{w.context_tokens:,} context tokens (engine-advisor calibrate run, then fit) "
                 "to replace it")
        if rival and rival.config.engine != best.config.engine \
                and rival.pred.total_s < bp.total_s * 1.005:
            r.append(SAME_PRIOR)
    elif not bp.calibrated:
        r.append(f"{best_l} has no calibration data on {gpu} x {w.num_gpus}: "
                 "extrapolated from the physics prior (allow_extrapolation)")
    elif bp.extrapolated:
        r.append("the workload lies outside the calibrated range: the interval is widened")
    return r


def reasons(w: Workload, shape: ModelShape, gpu: str, d: Decision, provenance: str,
            moe_notes: dict[str, str]) -> list[str]:
    """The decision ``d`` in sentences, in order: the choice against its rival, a faster
    configuration that may not be chosen (``d.unmeasured``: no calibration data, and
    ``allow_extrapolation`` is false), where the decode step's time goes, queueing, the
    crossover, what the answer rests on (``d.prior_why``: why it is the physics prior's), a tie,
    low confidence, and where the GPU's physics came from (``provenance``); and, per engine
    (``moe_notes``), its fused-MoE kernel where it runs slower than its reference."""
    best, rival, speedup, cross = d.best, d.rival, d.speedup, d.crossover
    unmeasured, prior_why, confidence = d.unmeasured, d.prior_why, d.confidence
    bp = best.pred
    best_l = _label(best)
    rival_l = _label(rival) if rival else ""
    r = [f"{best_l} is predicted fastest{' of the measured configurations' if unmeasured else ''}"
         f": {bp.total_s:.1f} s for {w.batch_size} sequences "
         f"of {w.context_tokens:,} + {w.output_tokens:,} tokens"
         + (f", {speedup:.2f}x faster than {rival_l} ({rival.pred.total_s:.1f} s)"
            if rival and speedup else "")]
    if unmeasured:
        u = unmeasured.pred.total_s
        r.append(f"{_label(unmeasured)}, not measured on {gpu} x {w.num_gpus}, "
                 f"is predicted {bp.total_s / u:.2f}x faster ({u:.1f} s) by the physics prior: "
                 "calibrate it, or set allow_extrapolation to let it be chosen")
    # (a prediction's TPOT is its decode step: the sum of the step's terms)
    r.append(f"decode is {_share(bp.decode_s / max(bp.total_s, 1e-12))} of the time; one decode "
             f"step of {bp.running_sequences} sequences takes {bp.tpot_s * 1e3:.1f} ms: "
             f"{step_story(best.pred.step_terms_s)}")
    if rival:
        r.append(f"{rival_l}: {rival.pred.tpot_s * 1e3:.1f} ms per step of "
                 f"{rival.pred.running_sequences} "
                 f"sequences: {step_story(rival.pred.step_terms_s)}")
    if bp.running_sequences < w.batch_size:
        r.append(f"{LIMIT_WORDS[bp.running_limit].format(p=bp)} holds {bp.running_sequences} "
                 f"of the {w.batch_size} sequences at once: the engine queues the rest and "
                 "admits each as a running one finishes, which the prediction includes")
    if bp.memory_flags:
        r.append(memory_story(w, shape, gpu, best))
    if rival and rival.pred.running_sequences < w.batch_size and rival.pred.running_sequences:
        r.append(f"{rival_l} holds {rival.pred.running_sequences} of {w.batch_size} "
                 f"sequences at once ({rival.pred.kv_capacity_tokens:,} KV tokens"
                 + (f", limited by {rival.pred.running_limit.replace('_', ' ')}"
                    if rival.pred.running_limit != "kv" else "") + ")")
    if cross:
        r.append(f"the best engine changes near {cross:,} context tokens")
    for engine in dict.fromkeys(e.config.engine for e in (best, rival) if e):
        note = moe_notes.get(engine)
        if note:
            r.append(f"prefill of the routed experts: {note}")
    r += trust_reasons(w, gpu, shape.weights_known, best, rival, prior_why)
    if rival and speedup is not None and rival.config.engine != best.config.engine \
            and speedup < 1.0 + TIE:
        r.append(f"{best.config.engine} and {rival.config.engine} tie: {best_l} is predicted "
                 f"only {speedup:.2f}x faster than {rival_l}, within the {TIE:.0%} the engines' "
                 "measured efficiencies can tell apart; choose on other needs")
    if confidence == "low" and rival:
        r.append(f"low confidence: the prediction intervals of {best_l} and "
                 f"{rival_l} overlap")
    r.append(provenance)
    return r
