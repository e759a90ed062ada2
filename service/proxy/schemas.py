"""Response models of the proxy's own endpoints (GET /v1/models, /v1/upstreams, /v1/route)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine_advisor.model.jsonnum import JsonModel
from engine_advisor.model.workload import MAX_CONTEXT, MAX_OUTPUT

if TYPE_CHECKING:
    from engine_advisor.service.proxy.state import ProxyState


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "engine-advisor"
    engines: list[str]
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class UpstreamInfo(BaseModel):
    name: str
    engine: str
    url: str
    model: str
    dcp_size: int
    mem_fraction: float
    healthy: bool
    available: bool
    breaker: str
    in_flight: int
    last_error: str | None


class ReloadInfo(BaseModel):
    ok: bool | None
    message: str | None
    at: float | None
    trigger: str | None


class UpstreamsStatus(BaseModel):
    file: str
    sha256: str
    generation: int
    loaded_at: float
    last_reload: ReloadInfo
    upstreams: list[UpstreamInfo]
    decision_cache_hits: int
    decision_cache_misses: int

    @classmethod
    def of(cls, st: ProxyState, now: float) -> UpstreamsStatus:
        p = st.pools
        ups = [UpstreamInfo(name=u.name, engine=u.engine, url=u.url, model=u.spec.model,
                            dcp_size=u.spec.dcp_size, mem_fraction=u.spec.mem_fraction,
                            healthy=u.healthy, available=u.available(now),
                            breaker=u.breaker.state, in_flight=u.in_flight,
                            last_error=u.last_error) for u in p.upstreams]
        return cls(file=p.source, sha256=p.sha256, generation=p.generation,
                   loaded_at=p.loaded_at, last_reload=ReloadInfo(**st.last_reload.as_dict()),
                   upstreams=ups, decision_cache_hits=st.decider.hits,
                   decision_cache_misses=st.decider.misses)


class ReloadResult(BaseModel):
    message: str
    generation: int
    upstreams: list[str]


class RouteWorkload(JsonModel):
    """POST /v1/route with a workload instead of an OpenAI request body."""

    model_config = ConfigDict(extra="forbid")

    context_tokens: Annotated[int, Field(gt=0, le=MAX_CONTEXT)]
    output_tokens: Annotated[int, Field(gt=0, le=MAX_OUTPUT)] | None = Field(
        default=None, description="default: the pools file's workload.output_tokens")
    model: str | None = None


class Predicted(BaseModel):
    ttft_s: float = Field(description="predicted prefill of the batch")
    tpot_s: float
    total_s: float = Field(description="predicted time for the batch of sequences like this one")
    interval_s: tuple[float, float]
    calibrated: bool


class Alternative(BaseModel):
    engine: str
    dcp_size: int
    predicted: Predicted | None


class RouteDecision(BaseModel):
    engine: str
    dcp_size: int
    upstream: str
    upstream_url: str
    model: str
    prompt_tokens: int
    prompt_tokens_method: str = Field(description="token_ids, tokenizer, upstream, estimate "
                                                  "or given")
    output_tokens: int
    batch_size: int = Field(description="the batch the decision assumed")
    predicted: Predicted | None
    confidence: str
    alternatives: list[Alternative] = Field(description="the other configured pools, best first")
    model_version: str
    note: str | None = None
