"""Capacity planning: how many nodes a traffic mix needs under a latency SLO.

Queueing assumption (also returned in every plan's ``assumptions``):

- One instance per node, tensor parallel over the node's ``gpus_per_node`` GPUs.
- An instance runs at a steady concurrency ``B`` (sequences in flight). Its per-request latency
  is the cost model's predicted wall time of a batch of ``B`` such sequences (``total_s``): every
  request is charged the prefill of all ``B`` sequences plus ``output_tokens - 1`` decode steps at
  concurrency ``B``. For continuous batching this is conservative.
- ``B`` is the largest concurrency whose predicted TPOT, TTFT and end-to-end time meet the SLO and
  whose KV demand ``B x (context + output)`` fits in the instance's KV capacity (and at most
  ``max_concurrency``). Larger ``B`` amortises each decode step's fixed cost, so it maximises
  throughput per GPU within the SLO.
- TTFT: a request arrives alone beside the ``B - 1`` others in flight (continuous batching
  admits it as another finishes): half a decode step's wait, the queue of the other arrivals'
  prefills, and its own prefill (``engine_advisor.model.predict.arrivals``). ``max_ttft_s`` bounds
  it.
- TPOT as a client measures it, ``(E2E - TTFT) / (output - 1)``: the decode step at ``B`` and
  the prefills of the requests that arrive while the request decodes. ``max_tpot_s`` bounds it.
- Little's law: requests in flight = ``rps x E2E(B)``. An instance holds ``B`` of them, kept at
  an average utilisation of ``headroom`` (< 1 leaves room for bursts), so
  ``instances = ceil(rps x E2E(B) / (B x headroom))``.
- Each class gets its own pool (its best configuration); ``total_nodes`` is the sum.

Each class's plan says how far to trust it as ``/v1/recommend`` does: its ``confidence`` is
``engine_advisor.model.decision.choose.trust``'s, the rule ``/v1/recommend`` applies, and its
``reasons`` are that answer's words (``engine_advisor.model.presentation.reasons.trust_reasons``):
``prior`` when nothing is calibrated for the hardware, ``low`` when the chosen configuration was
never measured or its rival needs as many instances with an overlapping interval, ``medium`` when
it is extrapolated or only the model's KV bytes per token are known, else ``high``. Only the plan
adds what KV bytes alone leave out of its times (the prompt's prefill compute and each decode
step's weight reads).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from engine_advisor.model import engines
from engine_advisor.model.decision.choose import overlap, trust
from engine_advisor.model.errors import validation_message
from engine_advisor.model.fit.costmodel import CostModel
from engine_advisor.model.hardware.gpus import GpuSpec
from engine_advisor.model.jsonnum import JsonModel
from engine_advisor.model.kv import KvDtype
from engine_advisor.model.physics.shape import ModelShape
from engine_advisor.model.predict.arrivals import arrival_tpot_s, arrival_ttft_s
from engine_advisor.model.predict.query import Evaluated
from engine_advisor.model.presentation.launch import (
    config_file,
    flag_value,
    launch_command,
    memory_reason,
)
from engine_advisor.model.presentation.reasons import trust_reasons
from engine_advisor.model.queries import evaluate, query_for
from engine_advisor.model.schemas import CONFIG_FILE, MEM_FLAG_VALUE, Confidence, ConfigFile
from engine_advisor.model.workload import (
    MAX_BATCH,
    MAX_CONTEXT,
    MAX_OUTPUT,
    N_ENGINES,
    Config,
    Engine,
    Requirements,
    Workload,
)

MAX_CLASSES = 64
MAX_INSTANCES = 10 ** 9      # a pool beyond this is no plan (a headroom near 0, say)
ASSUMPTIONS = [
    "one instance per node, tensor parallel over the node's GPUs",
    "an instance runs at a steady concurrency B; a request's end-to-end time is the predicted "
    "wall time of a batch of B such sequences (conservative for continuous batching)",
    "B is the largest concurrency meeting the SLO (predicted TPOT, TTFT and end-to-end) whose KV "
    "demand B x (context + output) fits in the instance's KV capacity, at most max_concurrency",
    "TTFT: a request arrives alone beside the B - 1 others in flight: half a decode step's wait, "
    "the queue of the other arrivals' prefills (M/D/1) and its own prefill",
    "TPOT as a client measures it, (E2E - TTFT) / (output - 1): the decode step at B plus the "
    "prefills of the requests arriving while it decodes",
    "Little's law: in flight = rps x E2E(B); instances = ceil(rps x E2E(B) / (B x headroom))",
    "each class runs in its own pool of nodes; total_nodes is the sum over classes",
]
# what only KV bytes per token leave out of a plan (after /v1/recommend's KV_ONLY sentence)
KV_ONLY_PLAN = ("with only KV bytes per token, the plan's times leave out the prompt's prefill "
                "compute and each decode step's weight reads: its TTFT, TPOT and end-to-end time "
                "are lower bounds and its concurrency and node count optimistic; give a preset "
                "or hf_config to plan on them")


class TrafficClass(JsonModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    context_tokens: Annotated[int, Field(gt=0, le=MAX_CONTEXT, description="prompt tokens")]
    output_tokens: Annotated[int, Field(gt=0, le=MAX_OUTPUT, description="output tokens")]
    requests_per_second: Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]


class Slo(JsonModel):
    model_config = ConfigDict(extra="forbid")

    max_tpot_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False,
                                       description="max time per output token")] | None = None
    max_e2e_s: Annotated[float, Field(
        gt=0, le=1e7, allow_inf_nan=False,
        description="max end-to-end seconds per request")] | None = None
    max_ttft_s: Annotated[float, Field(
        gt=0, le=3600, allow_inf_nan=False,
        description="max mean time to first token of a request arriving beside the others in "
                    "flight")] | None = None

    @model_validator(mode="after")
    def _one(self) -> Slo:
        if self.max_tpot_s is None and self.max_e2e_s is None and self.max_ttft_s is None:
            raise ValueError("give max_tpot_s, max_ttft_s and/or max_e2e_s")
        return self


class PlanRequest(JsonModel):
    model_config = ConfigDict(extra="forbid")

    classes: Annotated[list[TrafficClass], Field(min_length=1, max_length=MAX_CLASSES)]
    gpu: str | GpuSpec = "B300"
    gpus_per_node: Annotated[int, Field(gt=0, le=64)] = 8
    kv_bytes_per_token: Annotated[int, Field(gt=0, le=1 << 26)] | None = None
    hf_config: dict[str, Any] | None = None
    preset: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    kv_cache_dtype: KvDtype = "bf16"
    model_weight_bytes: Annotated[float, Field(gt=0, lt=1e14, allow_inf_nan=False)] | None = None
    model: Annotated[str, Field(min_length=1, max_length=256,
                                pattern=r"^[\w./:@+-]+$")] | None = None
    slo: Slo
    engines: Annotated[list[Engine], Field(
        min_length=1, max_length=N_ENGINES,
        description="the engines to consider (default: vllm and sglang; trtllm, predicted from "
                    "physics priors only, when named here)")] | None = None
    dcp_sizes: Annotated[list[Annotated[int, Field(gt=0, le=64)]],
                         Field(min_length=1, max_length=16)] | None = None
    requirements: Requirements | None = None
    allow_extrapolation: bool = False
    headroom: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False,
                                     description="target average utilisation of B")] = 0.8
    max_concurrency: Annotated[int, Field(gt=0, le=MAX_BATCH)] = 4096

    @model_validator(mode="after")
    def _check(self) -> PlanRequest:
        try:
            self.workload(self.classes[0])
        except ValidationError as exc:
            raise ValueError(validation_message(exc)) from None
        return self

    def workload(self, c: TrafficClass) -> Workload:
        """The class as a recommendation workload at concurrency 1 on one node."""
        fields = ("gpu", "kv_bytes_per_token", "hf_config", "preset", "kv_cache_dtype",
                  "model_weight_bytes", "model", "engines", "dcp_sizes", "requirements",
                  "allow_extrapolation")
        data = {k: getattr(self, k) for k in fields if getattr(self, k) is not None}
        return Workload.model_validate({**data, "context_tokens": c.context_tokens,
                                        "output_tokens": c.output_tokens, "batch_size": 1,
                                        "num_gpus": self.gpus_per_node})


class Option(BaseModel):
    engine: str
    dcp_size: int
    mem_fraction: float
    concurrency: int
    instances: int
    predicted_tpot_s: float
    predicted_ttft_s: float | None
    predicted_e2e_s: float
    limited_by: str


class ClassPlan(BaseModel):
    index: int
    name: str | None
    context_tokens: int
    output_tokens: int
    requests_per_second: float
    engine: str
    dcp_size: int
    mem_fraction: float
    mem_fraction_flag: str
    mem_flag_value: float | None = Field(default=None, description=MEM_FLAG_VALUE)
    config_file: ConfigFile | None = Field(default=None, description=CONFIG_FILE)
    concurrency: int
    limited_by: str
    instances: int
    gpus: int
    nodes: int
    predicted_tpot_s: float
    predicted_ttft_s: float | None = Field(
        description="mean time to first token of a request arriving beside the others in "
                    "flight; null for a single-token output beside others (no decode, no "
                    "steady state)")
    predicted_e2e_s: float
    e2e_interval_s: tuple[float, float]
    calibrated: bool
    extrapolated: bool
    confidence: Confidence = Field(
        description="as /v1/recommend's, for this class's configuration: prior (nothing "
                    "calibrated for the hardware), low (never measured, or a rival needing as "
                    "many instances with an overlapping interval), medium (extrapolated, or only "
                    "KV bytes per token known), high")
    reasons: list[str] = Field(
        description="what the plan rests on and how far to trust it: only KV bytes per token "
                    "known, answered from the physics prior, extrapolated, low confidence")
    kv_capacity_tokens: int
    instance_requests_per_s: float
    requests_per_s_per_gpu: float
    output_tokens_per_s_per_gpu: float
    utilisation: float
    launch_command: list[str]
    alternatives: list[Option]


class Unserved(BaseModel):
    index: int
    name: str | None
    reason: str


class PlanResult(BaseModel):
    classes: list[ClassPlan]
    unserved: list[Unserved]
    total_nodes: int
    total_gpus: int
    gpus_per_node: int
    headroom: float
    assumptions: list[str]
    model_version: str


class _Candidate(NamedTuple):
    """One configuration's answer for a class: its pool and latencies at concurrency B."""

    instances: int
    e2e: float
    ev: Evaluated              # the evaluation at B
    batch: int                 # B
    limit: str
    tpot: float
    ttft: float | None


def _at(model: CostModel, w: Workload, config: Config, batch: int) -> Evaluated:
    return evaluate(model, w.model_copy(update={"batch_size": batch}), [config])[0]


def _latencies(e: Evaluated, e1: Evaluated, w: Workload, batch: int) -> tuple[float, float]:
    """(TPOT, TTFT) at concurrency ``batch`` (``e``) of a request arriving beside the others in
    flight (``engine_advisor.model.predict.arrivals``), as a client measures them: its decode
    carries the prefills of the requests arriving meanwhile. One prompt's prefill is ``e1``'s (the
    same configuration at batch 1)."""
    p, step = e1.pred.prefill_s, e.pred.tpot_s
    return (arrival_tpot_s(p, step, w.output_tokens, batch),
            arrival_ttft_s(p, step, w.output_tokens, batch))


def _violation(e: Evaluated, slo: Slo, tpot: float, ttft: float) -> tuple[str, str] | None:
    """The first SLO bound the evaluation misses, as (the plan's ``limited_by`` value, why),
    or None."""
    p = e.pred
    if slo.max_tpot_s is not None and tpot > slo.max_tpot_s:
        return "slo_tpot", f"TPOT {tpot * 1e3:.1f} ms > {slo.max_tpot_s * 1e3:.1f} ms"
    if slo.max_ttft_s is not None and ttft > slo.max_ttft_s:
        shown = "unbounded (no decode to absorb the arrivals)" if math.isinf(ttft) else \
            f"{ttft * 1e3:.1f} ms"
        return "slo_ttft", f"TTFT {shown} > {slo.max_ttft_s * 1e3:.1f} ms"
    if slo.max_e2e_s is not None and p.total_s > slo.max_e2e_s:
        return "slo_e2e", f"end-to-end {p.total_s:.2f} s > {slo.max_e2e_s:.2f} s"
    return None


def _best_concurrency(model: CostModel, w: Workload, e1: Evaluated, req: PlanRequest
                      ) -> tuple[Evaluated, int, str] | str:
    """(evaluation at B, B, what limits B) or the reason the config cannot meet the SLO."""
    per_seq = w.context_tokens + w.output_tokens
    # the most sequences the instance's memory runs at once: KV, and a hybrid's state as its engine
    # lays it out, with the memory knobs chosen for that many
    # (engine_advisor.model.formulas.memory.memory_fit)
    kv_max = _at(model, w, e1.config, req.max_concurrency).pred.running_sequences
    label = f"{e1.config.engine} dcp {e1.config.dcp_size}"
    if kv_max < 1:
        return (f"{label}: one sequence needs {per_seq:,} KV tokens, the instance holds "
                f"{e1.pred.kv_capacity_tokens:,}")
    def violation(e: Evaluated, batch: int) -> tuple[str, str] | None:
        return _violation(e, req.slo, *_latencies(e, e1, w, batch))

    missed = violation(e1, 1)
    if missed:
        return f"{label}: even one sequence at a time misses the SLO ({missed[1]})"
    cap = min(kv_max, req.max_concurrency)
    lo, best, hi = 1, e1, cap + 1  # ok(lo), not ok(hi) or beyond the cap
    step = 1
    while lo + step < hi:  # grow geometrically, then bisect
        e = _at(model, w, e1.config, lo + step)
        if violation(e, lo + step):
            hi = lo + step
            break
        lo, best, step = lo + step, e, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        e = _at(model, w, e1.config, mid)
        if violation(e, mid):
            hi = mid
        else:
            lo, best = mid, e
    if lo == kv_max:
        limit = "kv_capacity"
    elif lo == req.max_concurrency:
        limit = "max_concurrency"
    else:
        nxt = violation(_at(model, w, e1.config, lo + 1), lo + 1)
        limit = nxt[0] if nxt else "slo_e2e"
    return best, lo, limit


def _plan_class(model: CostModel, req: PlanRequest, i: int,
                c: TrafficClass) -> ClassPlan | Unserved:
    w = req.workload(c)
    q = query_for(model, w)
    reasons = [x.describe() for x in q.excluded]
    options = []
    evals = q.evaluate(w)
    for e1 in evals:
        label = f"{e1.config.engine} dcp {e1.config.dcp_size}"
        if not e1.eligible:     # holds no sequence, or not calibrated (as /v1/recommend says)
            reasons.append(f"{label}: {e1.pred.ineligible_reason}")
            continue
        found = _best_concurrency(model, w, e1, req)
        if isinstance(found, str):
            reasons.append(found)
            continue
        e, b, limit = found
        e2e = max(e.pred.total_s, 1e-9)  # a degenerate fit must not divide by zero
        need = c.requests_per_second * e2e / (b * req.headroom)
        if not need <= MAX_INSTANCES:       # also NaN / inf (a headroom near 0)
            reasons.append(f"{label}: would need more than {MAX_INSTANCES:,} instances "
                           f"({c.requests_per_second:g} req/s x {e2e:.3g} s end-to-end / "
                           f"({b} in flight x headroom {req.headroom:g}))")
            continue
        instances = max(1, math.ceil(need))
        tpot, ttft = _latencies(e, e1, w, b)
        options.append(_Candidate(instances, e2e, e, b, limit, tpot,
                                  None if math.isinf(ttft) else ttft))
    if not options:
        return Unserved(index=i, name=c.name, reason="no configuration meets the SLO: "
                        + ("; ".join(reasons) or "no candidate configuration"))
    options.sort(key=lambda o: (o.instances, o.e2e))
    instances, e2e, e, b, limit, tpot, ttft = options[0]
    p = e.pred
    confidence, why = _trust(w, q.shape, q.gpu, evals, options)
    gpus = instances * req.gpus_per_node
    rate = b / e2e
    rules = engines.get(e.config.engine)
    flags = list(p.memory_flags)      # the knobs its prediction at b in flight assumes
    if rules.max_running_flag in flags:
        flags[flags.index(rules.max_running_flag) + 1] = str(b)
    else:
        flags += [rules.max_running_flag, str(b)]
    cmd = launch_command(e.config.engine, e.config.dcp_size, p.mem_fraction, w, flags, q.shape)
    value = flag_value(e.config.engine, p.mem_fraction, w, q.shape, flags)
    config = config_file(e.config.engine, e.config.dcp_size, p.mem_fraction, w, flags, q.shape)
    memory = memory_reason(e.config.engine, p.mem_fraction, w, q.shape, flags)
    if memory:
        why = [*why, memory]
    if p.calibration_note:
        why = [*why, f"{e.config.engine} calibrated: false: {p.calibration_note}"]
    if rules.dcp_note and e.config.dcp_size > 1:
        why = [*why, f"{e.config.engine} dcp > 1: {rules.dcp_note}"]
    return ClassPlan(
        index=i, name=c.name, context_tokens=c.context_tokens, output_tokens=c.output_tokens,
        requests_per_second=c.requests_per_second, engine=e.config.engine,
        dcp_size=e.config.dcp_size, mem_fraction=p.mem_fraction,
        mem_fraction_flag=rules.mem_flag, mem_flag_value=value, config_file=config,
        concurrency=b, limited_by=limit,
        instances=instances, gpus=gpus, nodes=instances, predicted_tpot_s=tpot,
        predicted_ttft_s=ttft, predicted_e2e_s=e2e, e2e_interval_s=p.interval_s,
        calibrated=p.calibrated, extrapolated=p.extrapolated, confidence=confidence,
        reasons=why, kv_capacity_tokens=p.kv_capacity_tokens,
        instance_requests_per_s=rate, requests_per_s_per_gpu=rate / req.gpus_per_node,
        output_tokens_per_s_per_gpu=rate * c.output_tokens / req.gpus_per_node,
        utilisation=c.requests_per_second * e2e / (instances * b), launch_command=cmd,
        alternatives=[Option(engine=o.ev.config.engine, dcp_size=o.ev.config.dcp_size,
                             mem_fraction=o.ev.pred.mem_fraction, concurrency=o.batch,
                             instances=o.instances, predicted_tpot_s=o.tpot,
                             predicted_ttft_s=o.ttft, predicted_e2e_s=o.e2e,
                             limited_by=o.limit)
                      for o in options[1:]])


def _trust(w: Workload, shape: ModelShape, gpu: str, evals: list[Evaluated],
           options: list[_Candidate]) -> tuple[str, list[str]]:
    """(confidence, reasons) of a class's plan, its configuration ``options[0]``, by
    ``/v1/recommend``'s rule (``engine_advisor.model.decision.choose.trust``) and in its words
    (``engine_advisor.model.presentation.reasons.trust_reasons``). Its rival is the best option
    of another engine, else the next; it contests the plan when it needs as many instances.
    The plan adds what only KV bytes per token leave out of its times, and why it is low."""
    best = options[0]
    others = [o for o in options[1:] if o.ev.config.engine != best.ev.config.engine]
    rival = (others or options[1:] or [None])[0]
    tied = rival is not None and rival.instances == best.instances
    confidence, prior_why = trust(best.ev.pred, rival.ev.pred if tied else None,
                                  [e for e in evals if e.eligible], evals, shape.weights_known,
                                  gpu, w.num_gpus)
    reasons = trust_reasons(w, gpu, shape.weights_known, best.ev, rival.ev if rival else None,
                            prior_why)
    if not shape.weights_known:
        reasons.insert(1, KV_ONLY_PLAN)
    if confidence == "low" and tied and overlap(best.ev.pred, rival.ev.pred):
        n = best.instances
        reasons.append(f"low confidence: {best.ev.config.engine} dcp {best.ev.config.dcp_size} "
                       f"and {rival.ev.config.engine} dcp {rival.ev.config.dcp_size} need {n} "
                       f"instance{'s' if n != 1 else ''} each and their end-to-end intervals "
                       "overlap")
    return confidence, reasons


def plan(model: CostModel, req: PlanRequest, version: str) -> PlanResult:
    served, unserved = [], []
    for i, c in enumerate(req.classes):
        out = _plan_class(model, req, i, c)
        (served if isinstance(out, ClassPlan) else unserved).append(out)
    nodes = sum(p.nodes for p in served)
    return PlanResult(classes=served, unserved=unserved, total_nodes=nodes,
                      total_gpus=nodes * req.gpus_per_node, gpus_per_node=req.gpus_per_node,
                      headroom=req.headroom, assumptions=ASSUMPTIONS, model_version=version)
